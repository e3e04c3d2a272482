// #/connections, #/connections/{name}, #/channels, #/channels/{name}.

import * as api from '../api.js';
import { h, clear, fill, num, rate, bytes, link, enc, facts, table, section, form, json, when, queueLink,
         CONFIRM_DELETE } from '../dom.js';
import { pagedList } from '../list.js';
import { historyChart, rangePicker, rangeQuery } from '../charts.js';
import { detailsOf } from './overview.js';

const inVhost = (ctx, what) => () => (ctx.vhost() ? '/vhosts/' + enc(ctx.vhost()) + '/' + what : '/' + what);

function clientName(c) {
  const props = c.client_properties || {};
  return props.connection_name || props.product || '';
}

export async function connections(view, _params, ctx) {
  const list = pagedList('connections', inVhost(ctx, 'connections'), [
    { label: 'Name', sort: 'name', cell: (c) => link('#/connections/' + enc(c.name), c.name) },
    { label: 'Virtual host', sort: 'vhost', cell: (c) => c.vhost },
    { label: 'User', sort: 'user', cell: (c) => c.user },
    { label: 'Client', cell: clientName },
    { label: 'Protocol', sort: 'protocol', cell: (c) => c.protocol },
    { label: 'State', sort: 'state', cell: (c) => c.state },
    { label: 'Channels', sort: 'channels', cell: (c) => num(c.channels), num: true },
    { label: 'From client', sort: 'recv_oct_details.rate', cell: (c) => bytes(c.recv_oct_details && c.recv_oct_details.rate) + '/s', num: true },
    { label: 'To client', sort: 'send_oct_details.rate', cell: (c) => bytes(c.send_oct_details && c.send_oct_details.rate) + '/s', num: true },
    { label: 'Shard', sort: 'shard', field: 'shard', cell: (c) => String(c.shard), num: true },
  ], 'No connections');
  view.append(h('h1', null, 'Connections'), list.element);
  return list.refresh;
}

export async function connection(view, params) {
  const path = '/connections/' + enc(params.name);
  const info = h('div');
  const chans = h('div');
  view.append(h('h1', null, 'Connection ', h('b', null, params.name)), info, section('Channels', chans),
    section('Close this connection', form('close-connection', [
      { name: 'reason', label: 'Reason', value: 'Closed via management plugin' },
    ], 'Force close', async (v) => {
      await api.del(path, { 'X-Reason': v.reason });
      location.hash = '#/connections';
      return 'Closed.';
    }, CONFIRM_DELETE)));
  return async () => {
    const c = await api.get(path);
    clear(info).append(facts([
      ['Virtual host', c.vhost], ['User', c.user], ['State', c.state], ['Protocol', c.protocol],
      ['Client', clientName(c)], ['Client properties', h('pre', null, JSON.stringify(c.client_properties, null, 1))],
      ['Connected at', when(c.connected_at)], ['Heartbeat', c.timeout + ' s'], ['Frame max', num(c.frame_max)],
      ['Channel max', num(c.channel_max)], ['TLS', c.ssl ? 'yes' : 'no'],
      ['Received', bytes(c.recv_oct) + ' (' + rate(c.recv_oct_details) + ')'],
      ['Sent', bytes(c.send_oct) + ' (' + rate(c.send_oct_details) + ')'],
    ]));
    fill(chans, channelTable(await api.get(path + '/channels')));
  };
}

function channelTable(items) {
  return table([
    ['Channel', (ch) => link('#/channels/' + enc(ch.name), ch.name)],
    ['User', (ch) => ch.user], ['Mode', (ch) => (ch.confirm ? 'confirm' : '') + (ch.transactional ? 'tx' : '')],
    ['State', (ch) => ch.state], ['Consumers', (ch) => num(ch.consumer_count), { num: true }],
    ['Prefetch', (ch) => num(ch.prefetch_count), { num: true }],
    ['Unacked', (ch) => num(ch.messages_unacknowledged), { num: true }],
  ], items, 'No channels');
}

export async function channels(view, _params, ctx) {
  const list = pagedList('channels', inVhost(ctx, 'channels'), [
    { label: 'Channel', sort: 'name', cell: (ch) => link('#/channels/' + enc(ch.name), ch.name) },
    { label: 'Virtual host', sort: 'vhost', cell: (ch) => ch.vhost },
    { label: 'User', sort: 'user', cell: (ch) => ch.user },
    { label: 'Mode', cell: (ch) => (ch.confirm ? 'C' : '') + (ch.transactional ? 'T' : '') },
    { label: 'State', sort: 'state', cell: (ch) => ch.state },
    { label: 'Consumers', sort: 'consumer_count', cell: (ch) => num(ch.consumer_count), num: true },
    { label: 'Prefetch', sort: 'prefetch_count', cell: (ch) => num(ch.prefetch_count), num: true },
    { label: 'Unacked', sort: 'messages_unacknowledged', cell: (ch) => num(ch.messages_unacknowledged), num: true },
    ...CHANNEL_RATES.map(([key, label]) => ({ label, sort: 'message_stats.' + key + '_details.rate',
                                              cell: (ch) => rate(ch.message_stats && ch.message_stats[key + '_details']),
                                              num: true })),
  ], 'No channels');
  view.append(h('h1', null, 'Channels'), list.element);
  return list.refresh;
}

// The channel list's rate columns, as RabbitMQ's.
const CHANNEL_RATES = [['publish', 'Publish'], ['confirm', 'Confirm'], ['deliver_get', 'Deliver / get'], ['ack', 'Ack']];
// What the channel page charts: its publishing side, then its consuming side.
const RATES = ['publish', 'confirm', 'return_unroutable', 'deliver_get', 'ack', 'redeliver'];

export async function channel(view, params, ctx) {
  const info = h('div');
  const consumers = h('div');
  const rates = historyChart('Message rates', RATES, 'rates', '/s');
  view.append(h('h1', null, 'Channel ', h('b', null, params.name)), rangePicker(() => ctx.refresh()),
    h('div', { class: 'charts' }, rates.element), info, section('Consumers', consumers));
  return async () => {
    const ch = await api.get('/channels/' + enc(params.name) + '?' + rangeQuery('msg_rates'));
    rates.show(detailsOf(ch.message_stats, RATES));
    const details = ch.connection_details || {};
    clear(info).append(facts([
      ['Connection', link('#/connections/' + enc(details.name || ''), details.name || '')],
      ['Virtual host', ch.vhost], ['User', ch.user], ['State', ch.state],
      ['Confirm mode', ch.confirm ? 'yes' : 'no'], ['Transactional', ch.transactional ? 'yes' : 'no'],
      ['Prefetch count', num(ch.prefetch_count)], ['Unacked', num(ch.messages_unacknowledged)],
      // the totals so far (the samples are charted above)
      ...Object.entries(ch.message_stats || {}).filter(([k]) => !k.endsWith('_details')).map(([k, v]) => [k, num(v)]),
    ]));
    clear(consumers).append(consumerTable(ch.consumer_details || []));
  };
}

export function consumerTable(items) {
  return table([
    ['Channel', (c) => link('#/channels/' + enc((c.channel_details || {}).name || ''), (c.channel_details || {}).name || '')],
    ['Queue', (c) => queueLink((c.queue || {}).vhost || '', (c.queue || {}).name || '')],
    ['Consumer tag', (c) => c.consumer_tag], ['Ack required', (c) => (c.ack_required ? 'yes' : 'no')],
    ['Exclusive', (c) => (c.exclusive ? 'yes' : 'no')], ['Prefetch', (c) => num(c.prefetch_count), { num: true }],
    ['Active', (c) => (c.active === false ? 'no' : 'yes')], ['Arguments', (c) => json(c.arguments)],
  ], items, 'No consumers');
}
