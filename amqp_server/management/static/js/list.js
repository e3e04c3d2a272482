// A list as RabbitMQ's UI shows one: filtered by name (optionally as a
// regular expression), sorted by a column, paged, all on the server
// (`page`, `page_size`, `name`, `use_regex`, `sort`, `sort_reverse`), so a
// broker with 10,000 queues answers one page.

import { get } from './api.js';
import { h, clear } from './dom.js';

const remembered = new Map(); // list id -> its paging state, kept across refreshes and visits

// columns: [{label, sort (API field), cell(item), num, field}]; a column with `field` is shown only
// when an item of the page has that field (the "shard" of a node of several shards).
// path: API path without the query.
export function pagedList(id, path, columns, empty = 'Nothing to show') {
  const state = remembered.get(id) || { page: 1, pageSize: 100, name: '', regex: false, sort: '', reverse: false };
  remembered.set(id, state);
  const summary = h('span', { class: 'summary' });
  const pager = h('span', { class: 'pager' });
  const body = h('div', { class: 'list-body' });
  let refreshing = null;
  const filter = h('input', { name: 'filter', placeholder: 'Filter', value: state.name, size: 24,
    oninput: () => { state.name = filter.value; state.page = 1; refresh(); } });
  const regex = h('input', { type: 'checkbox', name: 'regex', checked: state.regex,
    onchange: () => { state.regex = regex.checked; state.page = 1; refresh(); } });
  const size = h('select', { name: 'page_size', onchange: () => { state.pageSize = Number(size.value); state.page = 1; refresh(); } },
    [20, 100, 500].map((n) => h('option', { value: String(n), selected: n === state.pageSize ? true : null }, String(n))));
  const element = h('div', { class: 'paged-list', id },
    h('div', { class: 'listbar' }, h('label', null, 'Filter: ', filter), h('label', null, regex, ' Regex'),
      h('label', null, 'Page size ', size), pager, summary),
    body);

  function query() {
    const q = new URLSearchParams({ page: state.page, page_size: state.pageSize, name: state.name,
      use_regex: state.regex, pagination: 'true' });
    if (state.sort) { q.set('sort', state.sort); q.set('sort_reverse', state.reverse); }
    return q.toString();
  }

  function header(column) {
    if (!column.sort) return h('th', null, column.label);
    const mark = state.sort === column.sort ? (state.reverse ? ' ▼' : ' ▲') : '';
    return h('th', { class: 'sortable', onclick: () => {
      state.reverse = state.sort === column.sort ? !state.reverse : false;
      state.sort = column.sort;
      refresh();
    } }, column.label + mark);
  }

  async function load() {
    let answer;
    try {
      answer = await get(path() + '?' + query());
    } catch (error) {
      if (error.message === 'page_out_of_range' && state.page > 1) { state.page = 1; return load(); }
      if (error.status === 400 && state.regex) {
        clear(body).append(h('p', { class: 'error' }, 'Invalid regular expression'));
        return;
      }
      throw error;
    }
    const items = (n) => n + (n === 1 ? ' item' : ' items');
    summary.textContent = answer.filtered_count === answer.total_count
      ? items(answer.total_count)
      : answer.filtered_count + ' of ' + items(answer.total_count) + ' match';
    clear(pager);
    if (answer.page_count > 1) {
      const pages = h('select', { name: 'page', onchange: () => { state.page = Number(pages.value); refresh(); } },
        Array.from({ length: answer.page_count }, (_, i) =>
          h('option', { value: String(i + 1), selected: i + 1 === answer.page ? true : null }, String(i + 1))));
      pager.append('Page ', pages, ' of ' + answer.page_count);
    }
    const shown = columns.filter((c) => !c.field || answer.items.some((item) => c.field in item));
    clear(body).append(answer.items.length
      ? h('table', null,
        h('thead', null, h('tr', null, shown.map(header))),
        h('tbody', null, answer.items.map((item) =>
          h('tr', null, shown.map((c) => h('td', { class: c.num ? 'num' : null }, c.cell(item)))))))
      : h('p', { class: 'muted' }, empty));
  }

  // Refreshes do not overlap: a refresh asked for while one runs follows it.
  let again = false;
  function refresh() {
    if (refreshing) {
      again = true;
      return refreshing;
    }
    refreshing = (async () => {
      do { again = false; await load(); } while (again);
    })().finally(() => { refreshing = null; });
    return refreshing;
  }

  return { element, refresh };
}
