"""`hutchctl`: rabbitmqctl's commands, arguments and output over the management HTTP API.

It talks to hutch's management API (or RabbitMQ's: the API is the same), so it
needs no Erlang cookie and runs from anywhere that reaches the URL. Modules:
`options` (argv and connection settings), `client` (HTTP), `terms` and
`formatters` (rabbitmqctl's table/json/csv output), `command` (what a command
is and what it runs with), the command modules (`listings`, `access`,
`policies`, `queues`, `node`), `registry` (the command table) and `main`.
"""
