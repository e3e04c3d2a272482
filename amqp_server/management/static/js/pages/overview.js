// #/ : queued messages and message rates over time, totals, the nodes with
// their memory, disk and alarms (monitoring users, as in RabbitMQ), the
// listeners, and definitions export and import (administrators).

import * as api from '../api.js';
import { h, clear, num, bytes, section, table, form, enc } from '../dom.js';
import { lineChart } from '../charts.js';

const RATES = ['publish', 'confirm', 'deliver_get', 'redeliver', 'ack', 'get', 'drop_unroutable'];

export function rateValues(stats) {
  const out = {};
  for (const key of RATES) out[key] = stats && stats[key + '_details'] ? stats[key + '_details'].rate : 0;
  return out;
}

function usage(used, limit, alarmed, label) {
  const share = limit ? Math.min(1, used / limit) : 0;
  return h('span', null,
    h('span', { class: 'bar' + (alarmed ? ' alarmed' : '') }, h('i', { style: null, 'data-share': share })),
    ' ', label, alarmed ? [' ', h('span', { class: 'alarm' }, 'alarm')] : null);
}

// Widths are set through the CSSOM (allowed by the CSP, unlike style attributes).
function sizeBars(root) {
  for (const bar of root.querySelectorAll('.bar i')) bar.style.width = (Number(bar.dataset.share) * 100) + '%';
}

function nodeTable(nodes) {
  const roles = nodes.some((n) => 'role' in n);
  const lags = nodes.some((n) => 'lag' in n || 'replication_lag' in n);
  const columns = [
    ['Name', (n) => n.name],
    roles ? ['Role', (n) => n.role || ''] : null,
    lags ? ['Lag', (n) => num(n.lag !== undefined ? n.lag : n.replication_lag), { num: true }] : null,
    nodes.some((n) => 'cluster_role' in n) ? ['Cluster', (n) => (n.in_sync_alarm
      ? h('span', { class: 'alarm' }, 'in-sync alarm: only this leader holds the data')
      : n.cluster_role + (n.replication && n.replication.state ? ' (' + n.replication.state + ')' : ''))] : null,
    ['Running', (n) => (n.running === false ? h('span', { class: 'alarm' }, 'down') : 'yes')],
    ['Memory', (n) => usage(n.mem_used, n.mem_limit, n.mem_alarm,
      bytes(n.mem_used) + ' of ' + bytes(n.mem_limit) + ' high watermark')],
    ['Disk free', (n) => usage(n.disk_free_limit, n.disk_free, n.disk_free_alarm,
      bytes(n.disk_free) + ' (limit ' + bytes(n.disk_free_limit) + ')')],
    ['File descriptors', (n) => num(n.fd_used) + ' / ' + num(n.fd_total)],
    ['Uptime', (n) => (n.uptime ? Math.round(n.uptime / 60000) + ' min' : '')],
  ].filter(Boolean);
  const el = table(columns, nodes);
  sizeBars(el);
  return el;
}

export async function page(view, _params, ctx) {
  const queued = lineChart('Queued messages', ['messages_ready', 'messages_unacknowledged', 'messages']);
  const rates = lineChart('Message rates', RATES, '/s');
  const totals = h('div', { id: 'totals' });
  const nodes = h('div', { id: 'nodes' });
  const listeners = h('div', { id: 'listeners' });
  view.append(h('h1', null, 'Overview'), h('div', { class: 'charts' }, queued.element, rates.element),
    section('Totals', totals));
  if (ctx.can('monitoring')) view.append(section('Nodes', nodes));
  view.append(section('Ports and contexts', listeners));
  if (ctx.can('administrator')) view.append(definitionsSection(ctx));

  return async () => {
    const vhost = ctx.vhost();
    const o = await api.get('/overview');
    // With one vhost selected, charts and totals follow it, as in RabbitMQ.
    const scope = vhost ? await api.get('/vhosts/' + enc(vhost)) : null;
    const queueTotals = scope || o.queue_totals || {};
    queued.push({ messages_ready: queueTotals.messages_ready, messages_unacknowledged: queueTotals.messages_unacknowledged,
                  messages: queueTotals.messages });
    rates.push(rateValues(scope ? scope.message_stats : o.message_stats));
    const t = o.object_totals || {};
    clear(totals).append(table([
      ['Connections', () => num(t.connections), { num: true }],
      ['Channels', () => num(t.channels), { num: true }],
      ['Exchanges', () => num(t.exchanges), { num: true }],
      ['Queues', () => num(t.queues), { num: true }],
      ['Consumers', () => num(t.consumers), { num: true }],
      ['Ready', () => num(queueTotals.messages_ready), { num: true }],
      ['Unacked', () => num(queueTotals.messages_unacknowledged), { num: true }],
      ['Total', () => num(queueTotals.messages), { num: true }],
    ], [o]), h('p', { class: 'muted' }, o.product_name + ' ' + o.product_version + ' on node ' + o.node
                                           + (vhost ? ' - virtual host ' + vhost : '')));
    if (ctx.can('monitoring')) clear(nodes).append(nodeTable(await api.get('/nodes')));
    clear(listeners).append(table([
      ['Protocol', (l) => l.protocol], ['Bound to', (l) => l.ip_address], ['Port', (l) => l.port, { num: true }],
    ], o.listeners || []));
  };
}

function definitionsSection(ctx) {
  const exportLink = h('a', { id: 'export-link', hidden: true }, 'download');
  const exportForm = form('export-definitions', [], 'Download broker definitions', async () => {
    const vhost = ctx.vhost();
    const data = await api.get(vhost ? '/definitions/' + enc(vhost) : '/definitions');
    const blob = new Blob([JSON.stringify(data, null, 2)], { type: 'application/json' });
    exportLink.href = URL.createObjectURL(blob);
    exportLink.download = 'hutch_definitions.json';
    exportLink.hidden = false;
    exportLink.click();
    return 'Exported ' + (vhost ? 'virtual host ' + vhost : 'all definitions') + '.';
  });
  const importForm = form('import-definitions', [
    { name: 'file', label: 'Definitions file', type: 'file' },
  ], 'Upload broker definitions', async (_values, el) => {
    const file = el.elements.file.files[0];
    if (!file) throw new Error('Choose a definitions file first');
    let data;
    try { data = JSON.parse(await file.text()); } catch (e) { throw new Error('Not a JSON file: ' + e.message); }
    const vhost = ctx.vhost();
    await api.post(vhost ? '/definitions/' + enc(vhost) : '/definitions', data);
    return 'Definitions imported.';
  });
  return section('Import / export definitions', h('p', { class: 'muted' },
    'Applies to the virtual host chosen at the top, or to the whole broker when "All" is chosen.'),
  exportForm, exportLink, ' ', importForm);
}
