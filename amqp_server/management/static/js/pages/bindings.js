// Bindings of an exchange or a queue, with the forms to add and remove them.

import * as api from '../api.js';
import { h, clear, enc, table, json, form, parseObject, queueLink, exchangeLink } from '../dom.js';

const SHORT = { queue: 'q', exchange: 'e' };

function destination(vhost, b) {
  return b.destination_type === 'queue' ? queueLink(vhost, b.destination) : exchangeLink(vhost, b.destination);
}

// `which`: 'source' (an exchange's outgoing bindings), 'destination' (an
// exchange's incoming ones) or 'queue'.
export function bindingTable(vhost, items, after) {
  return table([
    ['From', (b) => exchangeLink(vhost, b.source)],
    ['To', (b) => destination(vhost, b)],
    ['Routing key', (b) => b.routing_key], ['Arguments', (b) => json(b.arguments)],
    ['', (b) => (b.source === '' ? h('span', { class: 'muted' }, '(default binding)')
      : h('button', { type: 'button', class: 'unbind', onclick: async () => {
        await api.del('/bindings/' + enc(vhost) + '/e/' + enc(b.source) + '/' + SHORT[b.destination_type] + '/'
                      + enc(b.destination) + '/' + enc(b.properties_key));
        after();
      } }, 'Unbind'))],
  ], items, 'No bindings');
}

// A form adding a binding from `source` (an exchange page) or to a queue.
export function bindForm(vhost, fixed, after) {
  const fields = fixed.queue !== undefined
    ? [{ name: 'source', label: 'From exchange', required: true }]
    : [{ name: 'kind', label: 'To', type: 'select', options: [['q', 'Queue'], ['e', 'Exchange']] },
       { name: 'destination', label: 'Name', required: true }];
  return form('add-binding', [...fields,
    { name: 'routing_key', label: 'Routing key' },
    { name: 'arguments', label: 'Arguments (JSON)', type: 'textarea', placeholder: '{}' },
  ], 'Bind', async (v) => {
    const source = fixed.exchange !== undefined ? fixed.exchange : v.source;
    const kind = fixed.queue !== undefined ? 'q' : v.kind;
    const dest = fixed.queue !== undefined ? fixed.queue : v.destination;
    await api.post('/bindings/' + enc(vhost) + '/e/' + enc(source) + '/' + kind + '/' + enc(dest),
      { routing_key: v.routing_key, arguments: parseObject(v.arguments, 'Arguments') });
    after();
    return 'Bound.';
  });
}

export function bindingsHolder() {
  const el = h('div', { class: 'bindings' });
  return { el, show: (content) => clear(el).append(content) };
}
