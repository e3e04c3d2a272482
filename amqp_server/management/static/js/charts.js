// Line charts over time (uPlot, vendored in ../vendor), drawn from the
// samples the broker keeps (the API's `*_details.samples`, asked for with
// RabbitMQ's `lengths_age`/`lengths_incr` and `msg_rates_age`/`msg_rates_incr`),
// so a chart shows the chosen range as soon as its page opens.

const COLOURS = ['#e67e22', '#2980b9', '#27ae60', '#8e44ad', '#c0392b', '#16a085', '#7f8c8d'];

// [age, increment] in seconds, as RabbitMQ's UI offers them.
export const RANGES = [
  [60, 5, 'Last minute'], [600, 5, 'Last ten minutes'], [3600, 60, 'Last hour'],
  [28800, 600, 'Last eight hours'], [86400, 1800, 'Last day'],
];
const KEY = 'hutch.chart-range';

export function chartRange() {
  const stored = sessionStorage.getItem(KEY);
  return RANGES.find(([age]) => String(age) === stored) || RANGES[1];
}

// The query asking for the chosen range's samples for each prefix
// ('lengths', 'msg_rates', 'data_rates', 'node_stats').
export function rangeQuery(...prefixes) {
  const [age, incr] = chartRange();
  return prefixes.map((p) => p + '_age=' + age + '&' + p + '_incr=' + incr).join('&');
}

// A select of the ranges; `changed()` after a choice (the page refreshes).
export function rangePicker(changed) {
  const select = document.createElement('select');
  select.id = 'chart-range';
  select.name = 'chart-range';
  for (const [age, , label] of RANGES) {
    const option = document.createElement('option');
    option.value = String(age);
    option.textContent = label;
    option.selected = age === chartRange()[0];
    select.append(option);
  }
  select.addEventListener('change', () => { sessionStorage.setItem(KEY, select.value); changed(); });
  const label = document.createElement('label');
  label.className = 'chart-range';
  label.append('Charts: ', select);
  return label;
}

// The x range to show: the data's, or when it has fewer than two points the
// `span` seconds up to its point (or to now). Read from the data itself:
// for a single point uPlot asks the range function about a made-up span of
// 86,400,000 s after it (hence an axis from 2026 to 2029).
export function timeRange(u, min, max, span) {
  const times = u.data[0] || [];
  if (times.length < 2) {
    const end = times.length ? times[0] : Date.now() / 1000;
    return [end - span, end];
  }
  return [min, max];
}

// Time labels on one line, as long as the range needs: seconds within a
// few minutes, minutes within hours, the day beyond (uPlot's two-line
// default runs its labels into each other on a narrow chart).
const pad = (n) => String(n).padStart(2, '0');
function timeLabels(u, splits) {
  const span = u.scales.x.max - u.scales.x.min;
  return splits.map((t) => {
    const d = new Date(t * 1000);
    const clock = pad(d.getHours()) + ':' + pad(d.getMinutes());
    if (span <= 900) return clock + ':' + pad(d.getSeconds());
    if (span <= 6 * 3600) return clock;
    return pad(d.getDate()) + '/' + pad(d.getMonth() + 1) + ' ' + clock;
  });
}
const TIME_AXIS = { values: timeLabels, space: 70 };

// Samples are newest first; charts want times (s) and values oldest first.
function lengthPoints(details) {
  const samples = (details && details.samples) || [];
  return samples.map((s) => [s.timestamp / 1000, s.sample]).reverse();
}

// A counter's samples as rates: the change over each increment, at its end.
// The newest sample's time is now rounded up (RabbitMQ's): its increment has
// not ended, so it is left out rather than drawn as a fall.
function ratePoints(details) {
  const now = Date.now() / 1000;
  const points = lengthPoints(details).filter(([t]) => t <= now);
  return points.slice(1).map(([t, v], i) => [t, Math.max(0, (v - points[i][1]) / (t - points[i][0]))]);
}

function chartElement(title) {
  const element = document.createElement('div');
  element.className = 'chart';
  const heading = document.createElement('h3');
  heading.textContent = title;
  element.append(heading);
  return element;
}

// The shown x range on the element (data-from, data-to: seconds), for the tests.
const recordRange = (element) => (u) => {
  element.dataset.from = String(u.scales.x.min);
  element.dataset.to = String(u.scales.x.max);
};

// A chart of `labels`, each a field's `_details` from the API: `kind`
// 'lengths' draws the samples, 'rates' the change per second between them.
export function historyChart(title, labels, kind, unit = '') {
  const element = chartElement(title);
  const series = [{}, ...labels.map((label, i) => ({
    label, stroke: COLOURS[i % COLOURS.length], width: 1.5,
    value: (_u, v) => (v === null || v === undefined ? '-' : v.toFixed(unit === '/s' ? 1 : 0) + unit),
  }))];
  const empty = [[], ...labels.map(() => [])];
  // uPlot is the global the vendored script defines.
  const plot = new window.uPlot({ width: 460, height: 180, series, axes: [TIME_AXIS, { size: 60 }],
                                  hooks: { setScale: [recordRange(element)] },
                                  scales: { x: { time: true, range: (u, min, max) => timeRange(u, min, max, chartRange()[0]) },
                                            y: { range: (_u, _min, max) => [0, Math.max(max, 1)] } } },
                                empty, element);
  return {
    element,
    // details: {label: the field's `_details`} (absent: zeros)
    show(details) {
      const points = labels.map((label) => (kind === 'rates' ? ratePoints : lengthPoints)(details[label]));
      const longest = points.reduce((a, b) => (b.length > a.length ? b : a), []);
      const times = longest.map(([t]) => t);
      const columns = points.map((p) => times.map((_t, i) => (p[i] ? p[i][1] : 0)));
      element.dataset.points = String(times.length);  // what is drawn, for the tests
      element.dataset.max = String(Math.max(0, ...columns.flat()));
      plot.setData([times, ...columns]);
    },
  };
}

// A chart of given series over given times (seconds): {label: [values]},
// showing at least `span` seconds.
export function seriesChart(title, times, series, span = 600) {
  const element = chartElement(title);
  const labels = Object.keys(series);
  new window.uPlot({ width: 620, height: 200, axes: [TIME_AXIS, { size: 50 }], hooks: { setScale: [recordRange(element)] },
                     scales: { x: { time: true, range: (u, min, max) => timeRange(u, min, max, span) } },
                     series: [{}, ...labels.map((label, i) => ({ label, stroke: COLOURS[i % COLOURS.length], width: 1.5,
                                                                 paths: window.uPlot.paths.stepped({ align: 1 }) }))] },
                   [times, ...labels.map((label) => series[label])], element);
  return element;
}
