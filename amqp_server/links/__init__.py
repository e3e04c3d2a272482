"""Links between brokers: dynamic shovels and federation, AMQP 0-9-1
clients living inside the broker (aiormq), driven by the runtime parameters
and policies that vhosts/ stores (vhosts.parameters, vhosts.policies).

- `client`: connecting (a host-less URI is this node), publishing a message
  as received, URIs without passwords;
- `shovel`: one dynamic shovel;
- `supervisor`: `Links`, which starts and stops them as parameters change
  and answers the management API's status questions.
"""
