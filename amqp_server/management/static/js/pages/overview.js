// #/ : queued messages and message rates over the chosen range (the
// broker's samples), totals, the nodes with their cluster role, in-sync
// state and lag, memory, disk and alarms (monitoring users, as in
// RabbitMQ), the listeners, and definitions export and import
// (administrators). #/nodes/{name}: one node.

import * as api from '../api.js';
import { h, clear, fill, num, bytes, section, table, form, enc, facts, link } from '../dom.js';
import { historyChart, rangePicker, rangeQuery } from '../charts.js';

const RATES = ['publish', 'confirm', 'deliver_get', 'redeliver', 'ack', 'get', 'drop_unroutable'];
const LENGTHS = ['messages_ready', 'messages_unacknowledged', 'messages'];

// {label: details} of `keys` in `stats` (a message_stats or queue totals object)
export function detailsOf(stats, keys) {
  const out = {};
  for (const key of keys) out[key] = stats ? stats[key + '_details'] : undefined;
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

// A cluster member's replication, as /api/nodes reports it (hutch's
// `cluster_role` and `replication`: state, in_sync, lag_bytes, lag_seconds).
function lag(n) {
  const r = n.replication || {};
  if (n.cluster_role === 'leader') return '-';
  if (r.lag_bytes === null || r.lag_bytes === undefined) return '';
  return bytes(r.lag_bytes) + ' / ' + Number(r.lag_seconds || 0).toFixed(1) + ' s';
}

const memory = (n) => ('mem_used' in n ? usage(n.mem_used, n.mem_limit, n.mem_alarm,
  bytes(n.mem_used) + ' of ' + bytes(n.mem_limit) + ' high watermark') : '');
const disk = (n) => ('disk_free' in n ? usage(n.disk_free_limit, n.disk_free, n.disk_free_alarm,
  bytes(n.disk_free) + ' free (limit ' + bytes(n.disk_free_limit) + ')') : '');

// The cluster's name of a member, when its node name does not say it.
function memberName(n) {
  return n.cluster_node && !n.name.endsWith('@' + n.cluster_node) ? ' (' + n.cluster_node + ')' : '';
}

function nodeTable(nodes) {
  const clustered = nodes.some((n) => 'cluster_role' in n);
  const columns = [
    ['Name', (n) => [link('#/nodes/' + enc(n.name), n.name), memberName(n)]],
    clustered ? ['Role', (n) => (n.in_sync_alarm
      ? [n.cluster_role, ' ', h('span', { class: 'alarm' }, 'in-sync alarm: only this leader holds the data')]
      : n.cluster_role || '')] : null,
    clustered ? ['In sync', (n) => ((n.replication || {}).in_sync ? 'yes' : h('span', { class: 'alarm' }, 'no'))] : null,
    clustered ? ['Replication', (n) => (n.replication || {}).state || ''] : null,
    clustered ? ['Lag', lag, { num: true }] : null,
    // nodes of several shards: the shards whose group each node leads (docs/scaling.md)
    nodes.some((n) => 'leads_shards' in n)
      ? ['Leads shards', (n) => (n.leads_shards || []).join(', ') || 'none'] : null,
    ['Running', (n) => (n.running === false ? h('span', { class: 'alarm' }, 'down') : 'yes')],
    ['Memory', memory],
    ['Disk free', disk],
    ['File descriptors', (n) => ('fd_used' in n ? num(n.fd_used) + ' / ' + num(n.fd_total) : '')],
    ['Uptime', (n) => (n.uptime ? Math.round(n.uptime / 60000) + ' min' : '')],
  ].filter(Boolean);
  const el = table(columns, nodes);
  sizeBars(el);
  return el;
}

// Nodes of several shards in a cluster: each shard's replication group, its leader, its in-sync set
// and each follower's state and lag (hutch's /api/hutch/cluster, docs/scaling.md).
function followerLag(n) {
  const lagged = n.lag_bytes === null || n.lag_bytes === undefined ? ''
    : ', ' + bytes(n.lag_bytes) + ' / ' + Number(n.lag_seconds || 0).toFixed(1) + ' s';
  return n.name + ': ' + n.state + lagged;
}

function shardTable(groups) {
  return table([
    ['Shard', (g) => String(g.shard), { num: true }],
    ['Leader', (g) => g.leader || h('span', { class: 'alarm' }, 'none')],
    ['In sync', (g) => (g.in_sync || []).join(', ')],
    ['Followers', (g) => (g.reachable === false ? h('span', { class: 'muted' }, 'not linked to shard 0')
      : g.nodes.filter((n) => n.role === 'follower').map(followerLag).join('; '))],
  ], groups);
}

export async function page(view, _params, ctx) {
  const queued = historyChart('Queued messages', LENGTHS, 'lengths');
  const rates = historyChart('Message rates', RATES, 'rates', '/s');
  const totals = h('div', { id: 'totals' });
  const nodes = h('div', { id: 'nodes' });
  const listeners = h('div', { id: 'listeners' });
  const shards = h('div', { id: 'shards' });
  const shardSection = section('Shards', shards);
  shardSection.hidden = true;  // shown in a cluster of several shards per node
  view.append(h('h1', null, 'Overview'), rangePicker(() => ctx.refresh()),
    h('div', { class: 'charts' }, queued.element, rates.element), section('Totals', totals));
  if (ctx.can('monitoring')) view.append(section('Nodes', nodes), shardSection);
  view.append(section('Ports and contexts', listeners));
  if (ctx.can('administrator')) view.append(definitionsSection(ctx));

  return async () => {
    const vhost = ctx.vhost();
    const ranges = rangeQuery('lengths', 'msg_rates');
    const o = await api.get('/overview?' + ranges);
    // With one vhost selected, charts and totals follow it, as in RabbitMQ.
    const scope = vhost ? await api.get('/vhosts/' + enc(vhost) + '?' + ranges) : null;
    const queueTotals = scope || o.queue_totals || {};
    queued.show(detailsOf(queueTotals, LENGTHS));
    rates.show(detailsOf(scope ? scope.message_stats : o.message_stats, RATES));
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
    if (ctx.can('monitoring')) {
      const members = await api.get('/nodes');
      fill(nodes, nodeTable(members));
      const groups = members.some((n) => 'leads_shards' in n) ? (await api.get('/hutch/cluster')).shards : null;
      shardSection.hidden = !groups;
      if (groups) fill(shards, shardTable(groups));
    }
    clear(listeners).append(table([
      ['Protocol', (l) => l.protocol], ['Bound to', (l) => l.ip_address], ['Port', (l) => l.port, { num: true }],
    ], o.listeners || []));
  };
}

// #/nodes/{name}: one node's figures, its cluster role and replication,
// and (the node serving the API, which keeps their history) charts.
export async function node(view, params, ctx) {
  const path = '/nodes/' + enc(params.name);
  const info = h('div', { id: 'node-details' });
  const used = historyChart('Memory used', ['mem_used'], 'lengths');
  const files = historyChart('File descriptors', ['fd_used', 'sockets_used'], 'lengths');
  const charts = h('div', { class: 'charts' }, used.element, files.element);
  view.append(h('h1', null, 'Node ', h('b', null, params.name)), info, rangePicker(() => ctx.refresh()), charts);
  return async () => {
    const n = await api.get(path + '?' + rangeQuery('node_stats'));
    const r = n.replication || {};
    const el = facts([
      n.cluster_role ? ['Role', n.cluster_role] : null,
      n.cluster_role ? ['In sync', r.in_sync ? 'yes' : 'no'] : null,
      n.cluster_role ? ['Replication', r.state || ''] : null,
      n.cluster_role ? ['Lag', lag(n)] : null,
      ['Running', n.running === false ? 'no' : 'yes'],
      ['Memory', memory(n)], ['Disk free', disk(n)],
      ['File descriptors', 'fd_used' in n ? num(n.fd_used) + ' / ' + num(n.fd_total) : ''],
      ['Uptime', n.uptime ? Math.round(n.uptime / 60000) + ' min' : ''],
      ['Process', n.os_pid ? 'pid ' + n.os_pid + ', ' + num(n.processors) + ' processors' : ''],
    ]);
    sizeBars(el);
    clear(info).append(el);
    charts.hidden = !n.mem_used_details;  // a member's history is kept on the member, not here
    if (n.mem_used_details) {
      used.show({ mem_used: n.mem_used_details });
      files.show({ fd_used: n.fd_used_details, sockets_used: n.sockets_used_details });
    }
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
