// #/queues and #/queues/{vhost}/{name}: charts, hutch's message states,
// stream details, consumers, bindings, get / peek / move, purge, delete.

import * as api from '../api.js';
import { h, clear, enc, num, rate, bytes, facts, section, form, json, parseObject, queueLink, CONFIRM_DELETE_QUEUE,
         CONFIRM_PURGE } from '../dom.js';
import { pagedList } from '../list.js';
import { historyChart, rangePicker, rangeQuery } from '../charts.js';
import { detailsOf } from './overview.js';
import { consumerTable } from './clients.js';
import { bindingTable, bindForm, bindingsHolder } from './bindings.js';

const STATES = ['alpha', 'beta', 'gamma', 'delta'];
// A stream's retention: its arguments, and the policy keys that apply to it
// (the policy's wins where both are set, as for the log's retention).
const RETENTION = ['max-age', 'max-length-bytes', 'stream-max-segment-size-bytes'];

function features(q) {
  const out = [];
  if (q.durable) out.push('D');
  if (q.auto_delete) out.push('AD');
  if (q.exclusive) out.push('Excl');
  for (const key of Object.keys(q.arguments || {})) out.push(key.replace(/^x-/, ''));
  return out.join(' ');
}

function stat(q, key) {
  return rate(q.message_stats && q.message_stats[key + '_details']);
}

// What the move form asks first (hutch's words; a move takes the messages out of the queue).
export function moveQuestion(source, v) {
  const count = v.count === '' ? 'All messages' : v.count + ' message(s)';
  return 'Are you sure? ' + count + ' of queue ' + source + ' are going to be moved to ' + v.kind + ' '
    + v.destination + '.';
}

export async function list(view, _params, ctx) {
  const paged = pagedList('queues', () => (ctx.vhost() ? '/queues/' + enc(ctx.vhost()) : '/queues'), [
    { label: 'Virtual host', sort: 'vhost', cell: (q) => q.vhost },
    { label: 'Name', sort: 'name', cell: (q) => queueLink(q.vhost, q.name) },
    { label: 'Type', sort: 'type', cell: (q) => q.type || 'classic' },
    { label: 'Features', cell: features },
    { label: 'Policy', sort: 'policy', cell: (q) => q.policy || '' },
    { label: 'State', sort: 'state', cell: (q) => q.state },
    { label: 'Ready', sort: 'messages_ready', cell: (q) => num(q.messages_ready), num: true },
    { label: 'Unacked', sort: 'messages_unacknowledged', cell: (q) => num(q.messages_unacknowledged), num: true },
    { label: 'Total', sort: 'messages', cell: (q) => num(q.messages), num: true },
    { label: 'Incoming', sort: 'message_stats.publish_details.rate', cell: (q) => stat(q, 'publish'), num: true },
    { label: 'Deliver / get', sort: 'message_stats.deliver_get_details.rate', cell: (q) => stat(q, 'deliver_get'), num: true },
    { label: 'Ack', sort: 'message_stats.ack_details.rate', cell: (q) => stat(q, 'ack'), num: true },
    { label: 'Shard', sort: 'shard', field: 'shard', cell: (q) => String(q.shard), num: true },
    { label: 'Leader', sort: 'leader', field: 'leader', cell: (q) => q.leader },
  ], 'No queues');
  view.append(h('h1', null, 'Queues'), paged.element, section('Add a new queue', form('add-queue', [
    { name: 'type', label: 'Type', type: 'select', options: [['classic', 'Classic'], ['stream', 'Stream']],
      value: 'classic' },
    { name: 'vhost', label: 'Virtual host', value: ctx.vhost() || '/', required: true },
    { name: 'name', label: 'Name', required: true },
    { name: 'durable', label: 'Durable', type: 'checkbox', value: true },
    { name: 'auto_delete', label: 'Auto delete', type: 'checkbox' },
    { name: 'arguments', label: 'Arguments (JSON)', type: 'textarea', placeholder: '{"x-message-ttl": 60000}' },
  ], 'Add queue', async (v) => {
    const args = parseObject(v.arguments, 'Arguments');
    if (v.type !== 'classic') args['x-queue-type'] = v.type;
    await api.put('/queues/' + enc(v.vhost) + '/' + enc(v.name), { durable: v.durable, auto_delete: v.auto_delete,
                                                                  arguments: args });
    paged.refresh();
    return 'Queue added.';
  })));
  return paged.refresh;
}

function streamFacts(q, log) {
  const args = q.arguments || {};
  const policy = q.effective_policy_definition || {};
  // offsets of the records kept: none in an empty stream, unknown without `log`
  const offset = (pick) => (log === null ? '' : log.next_offset > log.first_offset ? num(pick(log)) : 'none');
  return h('div', { id: 'stream-details' }, facts([
    ['Records kept', num(q.messages)], ['Size', bytes(q.message_bytes)],
    ['First offset', offset((l) => l.first_offset)], ['Last offset', offset((l) => l.next_offset - 1)],
    ['Next offset', log === null ? '' : num(log.next_offset)],
    ...RETENTION.filter((k) => 'x-' + k in args).map((k) => ['x-' + k, String(args['x-' + k])]),
    ...RETENTION.filter((k) => k in policy).map((k) => [k + ' (policy)', String(policy[k])]),
  ]), h('p', { class: 'muted' }, 'Records are read by consumers from an offset (x-stream-offset); '
    + 'a stream refuses basic.get, so Get messages shows the broker\'s refusal; Peek shows the first '
    + 'records kept, each with its offset in the x-stream-offset header.'));
}

function messageTable(messages) {
  if (!messages.length) return h('p', { class: 'muted', id: 'messages-none' }, 'Queue is empty');
  return h('div', { class: 'messages' }, messages.map((m, i) => [h('h3', null, 'Message ' + (i + 1)), facts([
    ['Exchange', m.exchange === '' ? '(AMQP default)' : m.exchange], ['Routing key', m.routing_key],
    ['Redelivered', m.redelivered ? 'yes' : 'no'], ['Remaining', num(m.message_count)],
    ['Properties', h('pre', null, JSON.stringify(m.properties, null, 1))],
    ['Payload (' + num(m.payload_bytes) + ' bytes, ' + m.payload_encoding + ')', h('pre', { class: 'payload' }, m.payload)],
  ])]));
}

const RATES = ['publish', 'deliver_get', 'ack', 'redeliver'];

export async function one(view, params, ctx) {
  const { vhost, name } = params;
  const path = '/queues/' + enc(vhost) + '/' + enc(name);
  const info = h('div');
  const states = h('div', { class: 'states', id: 'message-states' });
  const stream = h('div');
  const consumers = h('div');
  const bindings = bindingsHolder();
  const got = h('div', { id: 'got-messages' });
  const queued = historyChart('Queued messages', ['messages_ready', 'messages_unacknowledged'], 'lengths');
  const rates = historyChart('Message rates', RATES, 'rates', '/s');
  let refresh;
  const getForm = form('get-messages', [
    { name: 'ackmode', label: 'Ack mode', type: 'select', value: 'ack_requeue_true', options: [
      ['ack_requeue_true', 'Nack message requeue true'], ['ack_requeue_false', 'Automatic ack'],
      ['reject_requeue_true', 'Reject requeue true'], ['reject_requeue_false', 'Reject requeue false']] },
    { name: 'encoding', label: 'Encoding', type: 'select', value: 'auto',
      options: [['auto', 'Auto string / base64'], ['base64', 'base64']] },
    { name: 'count', label: 'Messages', type: 'number', value: 1 },
  ], 'Get message(s)', async (v) => {
    const messages = await api.post(path + '/get', { ackmode: v.ackmode, encoding: v.encoding,
                                                   count: Number(v.count), truncate: 50000 });
    clear(got).append(messageTable(messages));
    refresh();
    return messages.length + ' message(s).';
  });
  const peekForm = form('peek-messages', [{ name: 'count', label: 'Messages', type: 'number', value: 5 }],
    'Peek', async (v) => {
      const messages = await api.get(path + '/peek?count=' + Number(v.count));
      clear(got).append(messageTable(messages));
      return messages.length + ' message(s) at the head; none taken.';
    });
  view.append(h('h1', null, 'Queue ', h('b', { id: 'queue-name' }, name),
    h('span', { class: 'muted' }, ' in virtual host ' + vhost)), rangePicker(() => ctx.refresh()),
  h('div', { class: 'charts' }, queued.element, rates.element), section('Details', info),
  section('Message states (hutch)', states, h('p', { class: 'muted' },
    'alpha: body and position in memory; beta: body on disk; gamma: body on disk, position also in the index; '
    + 'delta: body and position on disk only.')),
  stream, section('Consumers', consumers),
  section('Bindings', bindings.el, bindForm(vhost, { queue: name }, () => refresh())),
  section('Get messages', h('p', { class: 'muted' }, 'Getting messages is a destructive action (with requeue they come back redelivered).'),
    getForm, ' ', peekForm, got),
  section('Move messages (hutch)', form('move-messages', [
    { name: 'kind', label: 'To', type: 'select', options: [['queue', 'Queue'], ['exchange', 'Exchange']] },
    { name: 'destination', label: 'Name', required: true },
    { name: 'routing_key', label: 'Routing key (exchange)' },
    { name: 'count', label: 'How many (empty: all)', type: 'number' },
  ], 'Move messages', async (v) => {
    const destination = { [v.kind]: v.destination };
    if (v.kind === 'exchange' && v.routing_key) destination.routing_key = v.routing_key;
    const body = { destination };
    if (v.count !== '') body.count = Number(v.count);
    const answer = await api.post(path + '/move', body);
    refresh();
    return 'Moved ' + answer.moved + ' message(s).';
  }, (v) => moveQuestion(name, v))),
  section('Purge', form('purge', [], 'Purge messages', async () => {
    await api.del(path + '/contents');
    refresh();
    return 'Purged.';
  }, CONFIRM_PURGE)),
  section('Delete', form('delete-queue', [
    { name: 'if_unused', label: 'Only if unused', type: 'checkbox' },
    { name: 'if_empty', label: 'Only if empty', type: 'checkbox' },
  ], 'Delete queue', async (v) => {
    await api.del(path + '?if-unused=' + v.if_unused + '&if-empty=' + v.if_empty);
    location.hash = '#/queues';
    return 'Deleted.';
  }, CONFIRM_DELETE_QUEUE)));

  refresh = async () => {
    const q = await api.get(path + '?' + rangeQuery('lengths', 'msg_rates'));
    queued.show(detailsOf(q, ['messages_ready', 'messages_unacknowledged']));
    rates.show(detailsOf(q.message_stats, RATES));
    clear(info).append(facts([
      ['Type', q.type || 'classic'], ['State', q.state], ['Features', features(q)],
      ['Arguments', json(q.arguments)], ['Policy', q.policy || ''],
      ['Effective policy definition', json(q.effective_policy_definition)],
      q.exclusive ? ['Exclusive owner', q.owner_pid_details ? q.owner_pid_details.name : 'yes'] : null,
      ['Consumers', num(q.consumers)], ['Consumer utilisation', q.consumer_utilisation == null ? '' : String(q.consumer_utilisation)],
      ['Messages ready', num(q.messages_ready)], ['Messages unacked', num(q.messages_unacknowledged)],
      ['Messages total', num(q.messages)], ['Bytes ready', bytes(q.message_bytes_ready)],
      ['Bytes unacked', bytes(q.message_bytes_unacknowledged)], ['Paged out', num(q.messages_paged_out)],
    ]));
    const counted = q.message_states || {};
    clear(states).append(...STATES.map((s) => h('span', { 'data-state': s }, h('b', null, s), ' ', num(counted[s] || 0))));
    if (q.type === 'stream') {
      // the offsets are not in the queue's object: hutch's stream route answers
      // them without records (it needs read permission; without it, no offsets)
      const log = await api.get('/hutch/streams/' + enc(vhost) + '/' + enc(name) + '?limit=0').catch(() => null);
      clear(stream).append(section('Stream', streamFacts(q, log)));
    } else {
      clear(stream);
    }
    clear(consumers).append(consumerTable(q.consumer_details || []));
    bindings.show(bindingTable(vhost, await api.get(path + '/bindings'), () => refresh()));
  };
  return refresh;
}
