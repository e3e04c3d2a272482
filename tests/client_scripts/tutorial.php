<?php
// What a new php-amqplib user writes (RabbitMQ's tutorials one, two and six):
// publish with confirms, get, a work queue with prefetch 1, RPC with a
// correlation id, and the errors. Usage: php tutorial.php PORT NAME
require_once '/usr/share/php/PhpAmqpLib/autoload.php';

use PhpAmqpLib\Connection\AMQPStreamConnection;
use PhpAmqpLib\Message\AMQPMessage;

[, $port, $q] = $argv;
$wait = 30;  // seconds: a bound for a loaded machine
$conn = new AMQPStreamConnection('127.0.0.1', (int)$port, 'guest', 'guest');
$ch = $conn->channel();
$ch->queue_declare($q, false, true, false, false);
$ch->confirm_select();
$ch->basic_publish(new AMQPMessage('hello', ['delivery_mode' => 2, 'content_type' => 'text/plain']), '', $q);
$ch->wait_for_pending_acks($wait);
$got = $ch->basic_get($q);
echo 'get: ', $got->getBody(), ' ', $got->get('content_type'), ' redelivered=', var_export($got->isRedelivered(), true), "\n";
$got->ack();

$ch->basic_qos(null, 1, null);
for ($i = 0; $i < 3; $i++) {
    $ch->basic_publish(new AMQPMessage("task $i"), '', $q);
}
$done = 0;
$tag = $ch->basic_consume($q, '', false, false, false, false, function ($m) use (&$done) {
    echo 'consumed: ', $m->getBody(), "\n";
    $m->ack();
    $done++;
});
while ($done < 3) {
    $ch->wait(null, false, $wait);
}
$ch->basic_cancel($tag);

$ch->queue_declare("$q.rpc", false, false, false, true);
$ch->basic_consume("$q.rpc", '', false, false, false, false, function ($request) {
    $reply = new AMQPMessage((string)((int)$request->getBody() * 2), ['correlation_id' => $request->get('correlation_id')]);
    $request->getChannel()->basic_publish($reply, '', $request->get('reply_to'));
    $request->ack();
});
$client = $conn->channel();
[$replies] = $client->queue_declare('', false, false, true, false);
$answer = null;
$client->basic_consume($replies, '', false, true, false, false, function ($m) use (&$answer) {
    $answer = [$m->get('correlation_id'), $m->getBody()];
});
$client->basic_publish(new AMQPMessage('21', ['correlation_id' => 'c1', 'reply_to' => $replies]), '', "$q.rpc");
$ch->wait(null, false, $wait);      // the server answers the request
$client->wait(null, false, $wait);  // the client reads the reply
echo 'rpc: ', implode(' ', $answer), ' on ', strncmp($replies, 'amq.gen-', 8) === 0 ? 'amq.gen-*' : $replies, "\n";

try {
    $conn->channel()->queue_declare("$q.missing", true);
} catch (\Exception $e) {
    echo 'passive: ', get_class($e), ' ', $e->getCode(), ' ', $e->getMessage(), "\n";
}
$ch = $conn->channel();
echo 'deleted: ', $ch->queue_delete($q), "\n";
$conn->close();
try {
    new AMQPStreamConnection('127.0.0.1', (int)$port, 'guest', 'wrong');
} catch (\Exception $e) {
    echo 'login: ', get_class($e), ' ', $e->getCode(), ' ', $e->getMessage(), "\n";
}
