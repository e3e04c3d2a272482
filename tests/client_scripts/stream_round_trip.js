// The JavaScript stream client (npm rabbitmq-stream-js-client) against a broker's stream port:
// create a stream, publish with a publisher reference and confirms, read back from the first
// offset, query the publisher's sequence; prints what it saw as JSON. Run by
// tests/test_stream_protocol.py (hutch) and tests/differential/test_diff_stream_protocol.py.
// Usage: node stream_round_trip.js PORT STREAM
const rabbit = require("rabbitmq-stream-js-client")

async function main() {
  const [port, stream] = process.argv.slice(2)
  const client = await rabbit.connect({
    hostname: "127.0.0.1", port: Number(port), username: "guest", password: "guest", vhost: "/",
  })
  await client.createStream({ stream })
  const publisher = await client.declarePublisher({ stream, publisherRef: "js-publisher" })
  const confirmed = []
  publisher.on("publish_confirm", (error, ids) => { if (error === null) confirmed.push(...ids.map(Number)) })
  for (let i = 0; i < 5; i++) {
    await publisher.send(Buffer.from("js-" + i), { applicationProperties: { i: i + 1 } })  // not 0: this client writes 0 as null
  }
  await publisher.flush()
  const deadline = Date.now() + 20000
  while (confirmed.length < 5 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20))
  const received = []
  const consumer = await client.declareConsumer({ stream, offset: rabbit.Offset.first() }, (message) => {
    received.push({ offset: Number(message.offset), body: message.content.toString(),
                    i: message.applicationProperties ? message.applicationProperties.i : null })
  })
  while (received.length < 5 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20))
  const sequence = Number(await publisher.getLastPublishingId())
  await consumer.close()
  await publisher.close()
  await client.deleteStream({ stream })
  await client.close()
  console.log(JSON.stringify({ confirmed: confirmed.sort((a, b) => a - b), received, sequence }))
}

main().catch((error) => { console.error(error); process.exit(1) })
