// Building the page from data: every text goes in as a text node (never as
// HTML), so names holding markup or script are shown as they are.

export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith('on')) el.addEventListener(key.slice(2), value);
    else if (key === 'class') el.className = value;
    else if (key === 'value' || key === 'checked') el[key] = value;
    else el.setAttribute(key, value === true ? '' : String(value));
  }
  append(el, children);
  return el;
}

export function append(el, children) {
  for (const child of [children].flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
  return el;
}

export function clear(el) {
  el.replaceChildren();
  return el;
}

// Replace el's content. What is awaited for it is awaited before anything is
// removed (fill(el, table(await ...))), so two refreshes that overlap leave
// one table, not two (`clear(el).append(table(await ...))` empties first).
export function fill(el, ...children) {
  el.replaceChildren();
  return append(el, children);
}

export const enc = encodeURIComponent;

export function link(hash, text) {
  return h('a', { href: hash }, text);
}

export function queueLink(vhost, name) {
  return link('#/queues/' + enc(vhost) + '/' + enc(name), name);
}

export function exchangeLink(vhost, name) {
  return link('#/exchanges/' + enc(vhost) + '/' + enc(name === '' ? 'amq.default' : name),
              name === '' ? '(AMQP default)' : name);
}

export function num(value) {
  return value === undefined || value === null ? '' : Number(value).toLocaleString('en');
}

export function rate(details) {
  return details && typeof details.rate === 'number' ? details.rate.toFixed(1) + '/s' : '';
}

export function bytes(value) {
  if (value === undefined || value === null) return '';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let n = Number(value), i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return (i ? n.toFixed(1) : n) + ' ' + units[i];
}

export function json(value) {
  return value === undefined || value === null ? '' : JSON.stringify(value);
}

export function when(ms) {
  return ms ? new Date(ms).toLocaleString('en-GB') : '';
}

// A table of objects: columns are [label, item -> cell content, {num}].
export function table(columns, items, empty = 'Nothing to show') {
  if (!items.length) return h('p', { class: 'muted' }, empty);
  return h('table', null,
    h('thead', null, h('tr', null, columns.map(([label]) => h('th', null, label)))),
    h('tbody', null, items.map((item) => h('tr', null, columns.map(([, cell, opts]) =>
      h('td', { class: opts && opts.num ? 'num' : null }, cell(item)))))));
}

// A two-column table of facts: rows are [label, content].
export function facts(rows) {
  return h('table', { class: 'facts' }, h('tbody', null,
    rows.filter((row) => row).map(([label, content]) => h('tr', null, h('th', null, label), h('td', null, content)))));
}

// What RabbitMQ's UI asks before it acts on a form it marks "confirm".
export const CONFIRM_DELETE = 'Are you sure? This object cannot be recovered after deletion.';
export const CONFIRM_DELETE_QUEUE = 'Are you sure? The queue is going to be deleted. '
  + 'Messages cannot be recovered after deletion.';
export const CONFIRM_PURGE = 'Are you sure? Messages cannot be recovered after purging.';

// A form of labelled fields; `submit(values, form)` may return a message
// (or throw one), shown beside the button. With `confirm` (a text, or
// values -> text) a destructive form asks first, as RabbitMQ's UI does, and
// does nothing when the answer is no.
export function form(id, fields, label, submit, confirm = null) {
  const note = h('span', { class: 'note', role: 'status' });
  const el = h('form', { class: 'box', id },
    fields.map((f) => [h('label', { for: id + '-' + f.name }, f.label), field(id, f)]),
    h('button', { type: 'submit' }, label), note);
  el.addEventListener('submit', async (event) => {
    event.preventDefault();
    const values = {};
    for (const f of fields) {
      const input = el.elements[f.name];
      values[f.name] = f.type === 'checkbox' ? input.checked : input.value;
    }
    note.className = 'note';
    note.textContent = '';
    if (confirm && !window.confirm(typeof confirm === 'function' ? confirm(values) : confirm)) return;
    try {
      const message = await submit(values, el);
      note.className = 'note ok';
      note.textContent = message || 'Done.';
    } catch (error) {
      note.className = 'note error';
      note.textContent = error.message || String(error);
    }
  });
  return el;
}

function field(id, f) {
  const attrs = { id: id + '-' + f.name, name: f.name, placeholder: f.placeholder, required: f.required };
  if (f.type === 'select') {
    return h('select', attrs, f.options.map(([value, text]) =>
      h('option', { value, selected: value === f.value ? true : null }, text)));
  }
  if (f.type === 'textarea') return h('textarea', attrs, f.value || '');
  if (f.type === 'checkbox') return h('input', { ...attrs, type: 'checkbox', checked: !!f.value });
  return h('input', { ...attrs, type: f.type || 'text', value: f.value === undefined ? '' : String(f.value) });
}

// JSON typed into a form: {} when empty, a readable error otherwise.
export function parseObject(text, what) {
  if (!text || !text.trim()) return {};
  let value;
  try { value = JSON.parse(text); } catch (e) { throw new Error(what + ' must be JSON: ' + e.message); }
  if (typeof value !== 'object' || value === null || Array.isArray(value)) throw new Error(what + ' must be a JSON object');
  return value;
}

export function section(title, ...children) {
  return h('section', null, h('h2', null, title), children);
}

// A message's body as text when it is UTF-8, else as base64.
export function body(base64) {
  if (base64 === null || base64 === undefined) return h('span', { class: 'muted' }, '(not kept)');
  const raw = Uint8Array.from(atob(base64), (c) => c.charCodeAt(0));
  try {
    return h('pre', null, new TextDecoder('utf-8', { fatal: true }).decode(raw));
  } catch (e) {
    return h('pre', null, base64 + ' (base64)');
  }
}
