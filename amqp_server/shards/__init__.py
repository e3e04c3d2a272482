"""The shards of one node (docs/scaling.md): the links between shard
processes (`link`), the order of definition changes (`definitions`), and a
shard's side of the queues it owns for the others (`node`)."""
