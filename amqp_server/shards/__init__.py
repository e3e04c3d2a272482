"""The shards of one node (docs/scaling.md): the links between shard
processes (`link`), the records they carry (`records`), the order of
definition changes (`definitions`), and a shard's side of its node
(`node`, the composition of `mesh`, `owner`, `port`, `moves`, `services`)."""
