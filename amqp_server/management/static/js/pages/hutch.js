// Pages beyond RabbitMQ's: #/dead-letters (hutch's dead-letter log), and
// the shovel and federation status pages, shown with RabbitMQ's API shapes
// when the broker offers those routes ("not available" on 404).

import * as api from '../api.js';
import { h, clear, enc, num, section, table, json, when, form, body, queueLink, exchangeLink } from '../dom.js';
import { seriesChart } from '../charts.js';
import { moveQuestion } from './queues.js';

const RECENT = 500;   // records read for the counts and charts
const SHOWN = 25;     // latest records listed
// Seconds per point of the over-time charts: about 60 points over the records' span.
const BUCKETS = [1, 5, 10, 30, 60, 300, 600, 1800, 3600, 21600, 86400];

function countBy(records, key) {
  const counts = new Map();
  for (const r of records) counts.set(r[key], (counts.get(r[key]) || 0) + 1);
  return [...counts.entries()].sort((a, b) => b[1] - a[1]);
}

// The records' earliest and latest times: on a node of several shards a record that died on
// another shard may reach the log a little after later deaths (docs/analytics.md).
function timeSpan(records) {
  const times = records.map((r) => r.time);
  return [Math.min(...times), Math.max(...times)];
}

function bucketFor(records) {
  const [earliest, latest] = records.length ? timeSpan(records) : [0, 0];
  const span = latest - earliest;
  return BUCKETS.find((b) => span / b <= 60) || BUCKETS[BUCKETS.length - 1];
}

function bucketName(seconds) {
  return seconds < 60 ? seconds + ' s' : seconds < 3600 ? seconds / 60 + ' min' : seconds / 3600 + ' h';
}

// Counts per bucket of time (record times are seconds), one series per value of `key`.
function overTime(records, key, bucket) {
  const [earliest, latest] = timeSpan(records);
  const first = Math.floor(earliest / bucket) * bucket;
  const last = Math.floor(latest / bucket) * bucket;
  const buckets = [];
  for (let t = first; t <= last; t += bucket) buckets.push(t);
  const index = new Map(buckets.map((t, i) => [t, i]));
  const series = {};
  for (const r of records) {
    const label = String(r[key]);
    if (!series[label]) series[label] = buckets.map(() => 0);
    series[label][index.get(Math.floor(r.time / bucket) * bucket)] += 1;
  }
  return [buckets, series];
}

export async function deadLetters(view, _params, ctx) {
  const names = (await api.get('/vhosts?columns=name')).map((v) => v.name);
  let current = ctx.vhost() || (names.includes('/') ? '/' : names[0]);
  const picker = h('select', { name: 'dl-vhost', onchange: () => { current = picker.value; refresh(); } },
    names.map((n) => h('option', { value: n, selected: n === current ? true : null }, n)));
  const summary = h('p', { id: 'dl-summary' });
  const charts = h('div', { class: 'charts' });
  const counts = h('div', { class: 'charts', id: 'dl-counts' });
  const latest = h('div', { id: 'dl-latest' });
  view.append(h('h1', null, 'Dead letters'), h('label', null, 'Virtual host ', picker), summary, charts, counts,
    section('Latest dead letters', latest),
    section('Replay a dead-letter queue', h('p', { class: 'muted' },
      'Moves the messages of a queue that collects dead letters back to a queue or an exchange.'),
    form('replay', [
      { name: 'source', label: 'Dead-letter queue', required: true },
      { name: 'kind', label: 'To', type: 'select', options: [['queue', 'Queue'], ['exchange', 'Exchange']] },
      { name: 'destination', label: 'Name', required: true },
      { name: 'routing_key', label: 'Routing key (exchange)' },
      { name: 'count', label: 'How many (empty: all)', type: 'number' },
    ], 'Replay', async (v) => {
      const destination = { [v.kind]: v.destination };
      if (v.kind === 'exchange' && v.routing_key) destination.routing_key = v.routing_key;
      const request = { destination };
      if (v.count !== '') request.count = Number(v.count);
      const answer = await api.post('/queues/' + enc(current) + '/' + enc(v.source) + '/move', request);
      return 'Replayed ' + answer.moved + ' message(s).';
    }, (v) => moveQuestion(v.source, v))));

  async function refresh() {
    const path = '/hutch/dead-letters/' + enc(current);
    let bounds;
    try {
      bounds = await api.get(path + '?limit=0');
    } catch (error) {
      clear(summary).append(h('span', { class: 'error' }, error.message));
      [charts, counts, latest].forEach(clear);
      return;
    }
    const start = Math.max(bounds.first_offset, bounds.next_offset - RECENT);
    const records = (await api.get(path + '?start=' + start + '&limit=' + RECENT)).records;
    summary.textContent = num(bounds.next_offset - bounds.first_offset) + ' dead letters kept in virtual host '
      + current + ' (offsets ' + bounds.first_offset + ' to ' + (bounds.next_offset - 1) + '); the charts and counts cover the latest '
      + records.length + '.';
    clear(charts);
    if (records.length) {
      const bucket = bucketFor(records);
      charts.append(seriesChart('By reason, per ' + bucketName(bucket), ...overTime(records, 'reason', bucket), bucket * 60),
        seriesChart('By queue, per ' + bucketName(bucket), ...overTime(records, 'queue', bucket), bucket * 60));
    }
    clear(counts).append(
      h('div', null, h('h2', null, 'By reason'), table([['Reason', (r) => r[0]], ['Count', (r) => num(r[1]), { num: true }]],
        countBy(records, 'reason'), 'None')),
      h('div', null, h('h2', null, 'By queue'), table([['Queue', (r) => queueLink(current, r[0])],
        ['Count', (r) => num(r[1]), { num: true }]], countBy(records, 'queue'), 'None')));
    clear(latest).append(table([
      ['Offset', (r) => r.offset, { num: true }], ['Time', (r) => when(r.time * 1000)], ['Queue', (r) => r.queue],
      ['Reason', (r) => r.reason], ['Exchange', (r) => (r.exchange === '' ? '(AMQP default)' : r.exchange)],
      ['Routing keys', (r) => (r.routing_keys || []).join(', ')],
      ['Dead-letter to', (r) => [r.dead_letter_exchange, r.dead_letter_routing_key].filter((x) => x).join(' / ')],
      ['Deaths', (r) => r.death_count, { num: true }],
      ['Properties', (r) => h('pre', null, JSON.stringify(r.properties, null, 1))],
      ['Body (' + 'bytes)', (r) => [num(r.body_size), ' ', body(r.body)]],
    ], records.slice(-SHOWN).reverse(), 'No dead letters'));
  }
  return refresh;
}

async function linkPage(view, ctx, title, path, columns, empty) {
  const holder = h('div', { id: 'links' });
  view.append(h('h1', null, title), holder);
  return async () => {
    const vhost = ctx.vhost();
    const found = await api.getOptional(vhost ? path + '/' + enc(vhost) : path);
    clear(holder).append(found === null
      ? h('p', { class: 'muted', id: 'not-available' }, title + ': not available on this broker.')
      : table(columns, found, empty));
  };
}

const endpoint = (l, side) => {
  const vhost = l.vhost || '/';
  if (l[side + '_queue']) return ['queue ', queueLink(vhost, l[side + '_queue'])];
  if (l[side + '_exchange']) return ['exchange ', l[side + '_uri'] ? l[side + '_exchange'] : exchangeLink(vhost, l[side + '_exchange'])];
  return '';
};

export function shovels(view, _params, ctx) {
  return linkPage(view, ctx, 'Shovels', '/shovels', [
    ['Name', (s) => s.name], ['Virtual host', (s) => s.vhost], ['Type', (s) => s.type], ['State', (s) => s.state],
    ['Source', (s) => [s.src_uri || '', ' ', endpoint(s, 'src')]],
    ['Destination', (s) => [s.dest_uri || '', ' ', endpoint(s, 'dest')]],
    ['Reason', (s) => (s.reason ? json(s.reason) : '')], ['Since', (s) => s.timestamp || ''],
  ], 'No shovels');
}

export function federation(view, _params, ctx) {
  return linkPage(view, ctx, 'Federation links', '/federation-links', [
    ['Upstream', (l) => l.upstream], ['Virtual host', (l) => l.vhost], ['Type', (l) => l.type],
    ['Local', (l) => (l.type === 'queue' ? queueLink(l.vhost, l.queue || '') : exchangeLink(l.vhost, l.exchange || ''))],
    ['URI', (l) => l.uri || ''], ['Status', (l) => l.status], ['Connection', (l) => l.local_connection || ''],
    ['Error', (l) => l.error || ''], ['Since', (l) => l.timestamp || ''],
  ], 'No federation links');
}
