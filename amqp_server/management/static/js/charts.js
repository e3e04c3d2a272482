// Line charts of numbers sampled by the UI at each refresh (uPlot, vendored
// in ../vendor). A chart keeps the last POINTS samples while its page is open.

const POINTS = 120;
const COLOURS = ['#e67e22', '#2980b9', '#27ae60', '#8e44ad', '#c0392b', '#16a085', '#7f8c8d'];

// At least `span` seconds up to the latest sample (uPlot would spread a
// single sample over years).
function timeRange(min, max, span) {
  const hi = Number.isFinite(max) ? max : Date.now() / 1000;
  return [Number.isFinite(min) ? Math.min(min, hi - span) : hi - span, hi];
}

export function lineChart(title, labels, unit = '') {
  const element = document.createElement('div');
  element.className = 'chart';
  const heading = document.createElement('h3');
  heading.textContent = title;
  element.append(heading);
  const data = [[], ...labels.map(() => [])];
  const series = [{}, ...labels.map((label, i) => ({
    label, stroke: COLOURS[i % COLOURS.length], width: 1.5,
    value: (_u, v) => (v === null || v === undefined ? '-' : v.toFixed(unit === '/s' ? 1 : 0) + unit),
  }))];
  // uPlot is the global the vendored script defines.
  const plot = new window.uPlot({ width: 460, height: 180, series, axes: [{}, { size: 60 }],
                                  scales: { x: { time: true, range: (_u, min, max) => timeRange(min, max, 60) },
                                            y: { range: (_u, min, max) => [0, Math.max(max, 1)] } } },
                                data, element);
  return {
    element,
    push(values) {
      data[0].push(Date.now() / 1000);
      labels.forEach((label, i) => data[i + 1].push(Number(values[label]) || 0));
      if (data[0].length > POINTS) data.forEach((column) => column.shift());
      plot.setData(data);
    },
  };
}

// A chart of given series over given times (seconds): {label: [values]},
// showing at least `span` seconds.
export function seriesChart(title, times, series, span = 600) {
  const element = document.createElement('div');
  element.className = 'chart';
  const heading = document.createElement('h3');
  heading.textContent = title;
  element.append(heading);
  const labels = Object.keys(series);
  new window.uPlot({ width: 620, height: 200, axes: [{}, { size: 50 }],
                     scales: { x: { time: true, range: (_u, min, max) => timeRange(min, max, span) } },
                     series: [{}, ...labels.map((label, i) => ({ label, stroke: COLOURS[i % COLOURS.length], width: 1.5,
                                                                 paths: window.uPlot.paths.stepped({ align: 1 }) }))] },
                   [times, ...labels.map((label) => series[label])], element);
  return element;
}
