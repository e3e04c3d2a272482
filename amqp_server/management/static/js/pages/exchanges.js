// #/exchanges and #/exchanges/{vhost}/{name}: its message rates charted
// from the broker's history, bindings both ways, publish a message, delete.

import * as api from '../api.js';
import { h, clear, enc, facts, section, form, json, rate, parseObject, exchangeLink, CONFIRM_DELETE } from '../dom.js';
import { pagedList } from '../list.js';
import { historyChart, rangePicker, rangeQuery } from '../charts.js';
import { detailsOf } from './overview.js';
import { bindingTable, bindForm, bindingsHolder } from './bindings.js';

export async function list(view, _params, ctx) {
  const paged = pagedList('exchanges', () => (ctx.vhost() ? '/exchanges/' + enc(ctx.vhost()) : '/exchanges'), [
    { label: 'Virtual host', sort: 'vhost', cell: (x) => x.vhost },
    { label: 'Name', sort: 'name', cell: (x) => exchangeLink(x.vhost, x.name) },
    { label: 'Type', sort: 'type', cell: (x) => x.type },
    { label: 'Features', cell: (x) => [x.durable ? 'D' : '', x.auto_delete ? ' AD' : '', x.internal ? ' I' : ''].join('') },
    { label: 'Policy', sort: 'policy', cell: (x) => x.policy || '' },
    { label: 'Rate in', sort: 'message_stats.publish_in_details.rate',
      cell: (x) => rate(x.message_stats && x.message_stats.publish_in_details), num: true },
    { label: 'Rate out', sort: 'message_stats.publish_out_details.rate',
      cell: (x) => rate(x.message_stats && x.message_stats.publish_out_details), num: true },
  ], 'No exchanges');
  const types = (await api.get('/overview')).exchange_types.map((t) => [t.name, t.name]);
  view.append(h('h1', null, 'Exchanges'), paged.element, section('Add a new exchange', form('add-exchange', [
    { name: 'vhost', label: 'Virtual host', value: ctx.vhost() || '/', required: true },
    { name: 'name', label: 'Name', required: true },
    { name: 'type', label: 'Type', type: 'select', options: types, value: 'direct' },
    { name: 'durable', label: 'Durable', type: 'checkbox', value: true },
    { name: 'auto_delete', label: 'Auto delete', type: 'checkbox' },
    { name: 'internal', label: 'Internal', type: 'checkbox' },
    { name: 'arguments', label: 'Arguments (JSON)', type: 'textarea', placeholder: '{"alternate-exchange": "ae"}' },
  ], 'Add exchange', async (v) => {
    await api.put('/exchanges/' + enc(v.vhost) + '/' + enc(v.name), { type: v.type, durable: v.durable,
      auto_delete: v.auto_delete, internal: v.internal, arguments: parseObject(v.arguments, 'Arguments') });
    paged.refresh();
    return 'Exchange added.';
  })));
  return paged.refresh;
}

// publish_in: messages published to the exchange; publish_out: the copies it routed to queues.
const RATES = ['publish_in', 'publish_out'];

export async function one(view, params, ctx) {
  const { vhost, name } = params;
  const path = '/exchanges/' + enc(vhost) + '/' + enc(name);
  const apiName = name === 'amq.default' ? '' : name;
  const info = h('div');
  const rates = historyChart('Message rates', RATES, 'rates', '/s');
  const outgoing = bindingsHolder();
  const incoming = bindingsHolder();
  let refresh;
  view.append(h('h1', null, 'Exchange ', h('b', null, apiName === '' ? '(AMQP default)' : apiName),
    h('span', { class: 'muted' }, ' in virtual host ' + vhost)), rangePicker(() => ctx.refresh()),
  h('div', { class: 'charts' }, rates.element), info);
  if (apiName !== '') {
    view.append(section('Bindings from this exchange', outgoing.el, bindForm(vhost, { exchange: apiName }, () => refresh())),
      section('Bindings to this exchange', incoming.el));
  }
  view.append(section('Publish message', form('publish', [
    { name: 'routing_key', label: 'Routing key' },
    { name: 'delivery_mode', label: 'Delivery mode', type: 'select',
      options: [['1', '1 - Non-persistent'], ['2', '2 - Persistent']], value: '1' },
    { name: 'headers', label: 'Headers (JSON)', type: 'textarea', placeholder: '{}' },
    { name: 'properties', label: 'Properties (JSON)', type: 'textarea', placeholder: '{"content_type": "text/plain"}' },
    { name: 'payload', label: 'Payload', type: 'textarea' },
  ], 'Publish message', async (v) => {
    const properties = parseObject(v.properties, 'Properties');
    properties.delivery_mode = Number(v.delivery_mode);
    const headers = parseObject(v.headers, 'Headers');
    if (Object.keys(headers).length) properties.headers = headers;
    const answer = await api.post(path + '/publish', { routing_key: v.routing_key, properties, payload: v.payload,
                                                      payload_encoding: 'string' });
    return answer.routed ? 'Message published.' : 'Message published, but not routed.';
  })));
  if (apiName !== '' && !apiName.startsWith('amq.')) {
    view.append(section('Delete this exchange', form('delete-exchange', [], 'Delete', async () => {
      await api.del(path);
      location.hash = '#/exchanges';
      return 'Deleted.';
    }, CONFIRM_DELETE)));
  }
  refresh = async () => {
    const x = await api.get(path + '?' + rangeQuery('msg_rates'));
    rates.show(detailsOf(x.message_stats, RATES));
    clear(info).append(facts([
      ['Type', x.type], ['Durable', x.durable ? 'yes' : 'no'], ['Auto delete', x.auto_delete ? 'yes' : 'no'],
      ['Internal', x.internal ? 'yes' : 'no'], ['Arguments', json(x.arguments)], ['Policy', x.policy || ''],
    ]));
    if (apiName !== '') {
      outgoing.show(bindingTable(vhost, await api.get(path + '/bindings/source'), () => refresh()));
      incoming.show(bindingTable(vhost, await api.get(path + '/bindings/destination'), () => refresh()));
    }
  };
  return refresh;
}
