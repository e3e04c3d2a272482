# What a new Bunny user writes (RabbitMQ's tutorials one, two, five and six):
# publish with confirms, pop, a work queue with prefetch 1, a topic exchange,
# RPC with a correlation id, and the errors. Usage: ruby tutorial.rb PORT NAME
require "bunny"
require "timeout"

port, q_name = ARGV[0].to_i, ARGV[1]
wait = 30 # seconds: a bound for a loaded machine
conn = Bunny.new(host: "127.0.0.1", port: port, user: "guest", pass: "guest", logger: Logger.new(nil))
conn.start
ch = conn.create_channel
q = ch.queue(q_name, durable: true)
ch.confirm_select
ch.default_exchange.publish("hello", routing_key: q.name, persistent: true, content_type: "text/plain",
                            headers: { "n" => 1 })
ch.wait_for_confirms
info, props, body = q.pop(manual_ack: true)
puts "pop: #{body} #{props.content_type} #{props.headers.inspect} redelivered=#{info.redelivered?}"
ch.ack(info.delivery_tag)

ch.prefetch(1)
got = Queue.new
consumer = q.subscribe(manual_ack: true) { |di, _p, b| got << b; ch.ack(di.delivery_tag) }
3.times { |i| ch.default_exchange.publish("task #{i}", routing_key: q.name) }
3.times { puts "consumed: #{Timeout.timeout(wait) { got.pop }}" }
consumer.cancel

x = ch.topic("#{q_name}.x", auto_delete: true)
ch.queue("", exclusive: true).bind(x, routing_key: "rpc.*").subscribe do |_di, p, b|
  ch.default_exchange.publish((b.to_i * 2).to_s, routing_key: p.reply_to, correlation_id: p.correlation_id)
end
client = conn.create_channel
replies = client.queue("", exclusive: true)
answers = Queue.new
replies.subscribe { |_di, p, b| answers << [p.correlation_id, b] }
client.topic(x.name, passive: true).publish("21", routing_key: "rpc.double", reply_to: replies.name,
                                            correlation_id: "c1")
client.topic(x.name, passive: true).publish("0", routing_key: "other.double") # routed nowhere
puts "rpc: #{Timeout.timeout(wait) { answers.pop }.inspect} on #{replies.name.start_with?('amq.gen-') ? 'amq.gen-*' : replies.name}"

begin
  conn.create_channel.queue("#{q_name}.missing", passive: true)
rescue Bunny::NotFound => e
  puts "passive: #{e.class} #{e.message}"
end
begin
  conn.create_channel.queue(q_name, durable: false)
rescue Bunny::PreconditionFailed => e
  puts "redeclare: #{e.class} #{e.message}"
end
puts "deleted: #{conn.create_channel.queue(q_name, passive: true).delete.message_count}"
conn.close
begin
  Bunny.new(host: "127.0.0.1", port: port, user: "guest", pass: "wrong", logger: Logger.new(nil),
            automatically_recover: false).start
rescue Bunny::AuthenticationFailureError => e
  puts "login: #{e.class}"
end
