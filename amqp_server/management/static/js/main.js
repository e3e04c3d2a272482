// The UI's shell: login, the tabs a user's tags allow (as RabbitMQ shows
// them), RabbitMQ's hash routes, the vhost selector and the refresh interval.

import * as api from './api.js';
import { h, clear } from './dom.js';
import * as overview from './pages/overview.js';
import * as clients from './pages/clients.js';
import * as exchanges from './pages/exchanges.js';
import * as queues from './pages/queues.js';
import * as admin from './pages/admin.js';
import * as hutch from './pages/hutch.js';

// tag a page needs -> the tags that grant it (access.py on the server)
const GRANTS = {
  management: ['management', 'policymaker', 'monitoring', 'administrator'],
  policymaker: ['policymaker', 'administrator'],
  monitoring: ['monitoring', 'administrator'],
  administrator: ['administrator'],
};

// [pattern, page, tag, tab]: the first match wins; "{x}" matches one segment.
const ROUTES = [
  ['', overview.page, 'management', 'overview'],
  ['connections', clients.connections, 'management', 'connections'],
  ['connections/{name}', clients.connection, 'management', 'connections'],
  ['channels', clients.channels, 'management', 'channels'],
  ['channels/{name}', clients.channel, 'management', 'channels'],
  ['exchanges', exchanges.list, 'management', 'exchanges'],
  ['exchanges/{vhost}/{name}', exchanges.one, 'management', 'exchanges'],
  ['queues', queues.list, 'management', 'queues'],
  ['queues/{vhost}/{name}', queues.one, 'management', 'queues'],
  ['dead-letters', hutch.deadLetters, 'management', 'dead-letters'],
  ['nodes/{name}', overview.node, 'monitoring', 'overview'],
  ['users', admin.users, 'administrator', 'admin'],
  ['users/{name}', admin.user, 'administrator', 'admin'],
  ['vhosts', admin.vhosts, 'administrator', 'admin'],
  ['vhosts/{name}', admin.vhost, 'administrator', 'admin'],
  ['policies', admin.policies, 'policymaker', 'admin'],
  ['limits', admin.limits, 'administrator', 'admin'],
  ['shovels', hutch.shovels, 'monitoring', 'admin'],
  ['federation', hutch.federation, 'monitoring', 'admin'],
];

const TABS = [
  ['overview', '#/', 'Overview', 'management'],
  ['connections', '#/connections', 'Connections', 'management'],
  ['channels', '#/channels', 'Channels', 'management'],
  ['exchanges', '#/exchanges', 'Exchanges', 'management'],
  ['queues', '#/queues', 'Queues', 'management'],
  ['dead-letters', '#/dead-letters', 'Dead letters', 'management'],
  ['admin', null, 'Admin', null],
];

const ADMIN_PAGES = [
  ['#/users', 'Users', 'administrator'],
  ['#/vhosts', 'Virtual hosts', 'administrator'],
  ['#/policies', 'Policies', 'policymaker'],
  ['#/limits', 'Limits', 'administrator'],
  ['#/shovels', 'Shovels', 'monitoring'],
  ['#/federation', 'Federation', 'monitoring'],
];

const $ = (id) => document.getElementById(id);
let user = null;
let update = null;  // the open page's refresh
let timer = null;
let shown = 0;      // which navigation the open page belongs to

function can(tag) {
  return user !== null && user.tags.some((t) => GRANTS[tag].includes(t));
}

function selectedVhost() {
  return sessionStorage.getItem('hutch.vhost') || null;
}

const context = { can, vhost: selectedVhost, user: () => (user ? user.name : null), refresh: () => refreshNow(),
                  vhostsChanged: () => fillVhosts() };

function match(segments) {
  for (const [pattern, page, tag, tab] of ROUTES) {
    const parts = pattern === '' ? [] : pattern.split('/');
    if (parts.length !== segments.length) continue;
    const params = {};
    if (parts.every((part, i) => (part.startsWith('{') ? ((params[part.slice(1, -1)] = segments[i]), true)
                                                       : part === segments[i]))) {
      return { page, tag, tab, params };
    }
  }
  return null;
}

function segmentsOf(hash) {
  const path = hash.replace(/^#\/?/, '').replace(/\/$/, '');
  return path === '' ? [] : path.split('/').map(decodeURIComponent);
}

function drawNav(tab) {
  const adminLinks = ADMIN_PAGES.filter(([, , tag]) => can(tag));
  clear($('nav')).append(...TABS.filter(([key, , , tag]) => (key === 'admin' ? adminLinks.length > 0 : can(tag)))
    .map(([key, href, label]) => h('a', { href: href || adminLinks[0][0], class: key === tab ? 'active' : null,
                                          id: 'tab-' + key }, label)));
  clear($('subnav'));
  if (tab === 'admin') {
    $('subnav').append(...adminLinks.map(([href, label]) =>
      h('a', { href, class: location.hash === href ? 'active' : null }, label)));
  }
}

// The view is aria-busy from a navigation until its page's first load has
// ended (shown or failed): assistive technology (and the UI's tests) wait
// for that before reading or using the page, whose layout moves as it fills.
async function route() {
  const navigation = ++shown;
  update = null;
  const view = clear($('view'));
  view.setAttribute('aria-busy', 'true');
  try {
    await load(view, navigation);
  } finally {
    if (navigation === shown) view.setAttribute('aria-busy', 'false');
  }
}

async function load(view, navigation) {
  const found = match(segmentsOf(location.hash));
  drawNav(found ? found.tab : null);
  if (!found) {
    view.append(h('h1', null, 'Not found'), h('p', null, 'No page at ' + location.hash));
    return;
  }
  if (!can(found.tag)) {
    view.append(h('h1', null, 'Not authorised'),
      h('p', { class: 'error' }, 'This page needs the ' + found.tag + ' tag.'));
    return;
  }
  try {
    const refresh = await found.page(view, found.params, context);
    if (navigation !== shown) return;
    update = refresh || null;
    if (update) await update();
  } catch (error) {
    if (navigation === shown) view.append(h('p', { class: 'error' }, error.message || String(error)));
  }
}

async function refreshNow() {
  if (!update) return;
  const navigation = shown;
  try {
    await update();
  } catch (error) {
    if (navigation === shown) showTransient(error.message || String(error));
  }
}

function showTransient(message) {
  const note = h('p', { class: 'error', id: 'refresh-error' }, message);
  const old = $('refresh-error');
  if (old) old.replaceWith(note); else $('view').prepend(note);
}

function startTimer() {
  clearInterval(timer);
  const every = Number($('refresh').value);
  if (every > 0) timer = setInterval(refreshNow, every);
}

async function fillVhosts() {
  const select = clear($('vhost-select'));
  const vhosts = await api.get('/vhosts?columns=name');
  select.append(h('option', { value: '' }, 'All'),
    ...vhosts.map((v) => h('option', { value: v.name, selected: v.name === selectedVhost() ? true : null }, v.name)));
  if (selectedVhost() && !vhosts.some((v) => v.name === selectedVhost())) sessionStorage.removeItem('hutch.vhost');
}

async function enter() {
  user = await api.get('/whoami');
  $('login').hidden = true;
  $('app').hidden = false;
  $('whoami').textContent = user.name;
  await fillVhosts();
  startTimer();
  await route();
}

function showLogin(message, failed = true) {
  api.signOut();
  user = null;
  clearInterval(timer);
  clear($('view'));
  $('app').hidden = true;
  $('login').hidden = false;
  $('login-error').textContent = message || '';
  $('login-error').className = failed ? 'error' : 'muted';
}

async function login(event) {
  event.preventDefault();
  const formEl = event.target;
  const button = formEl.querySelector('button');
  button.disabled = true;
  $('login-error').textContent = '';
  api.signIn(formEl.elements.username.value, formEl.elements.password.value);
  try {
    await enter();
    formEl.elements.password.value = '';
  } catch (error) {
    showLogin(error.status === 401 ? (error.message === 'Login failed' ? 'Login failed: wrong username or password'
                                                                       : 'Login failed: ' + error.message)
                                   : 'Login failed: ' + error.message);
  } finally {
    button.disabled = false;
  }
}

function start() {
  $('login-form').addEventListener('submit', login);
  $('logout').addEventListener('click', () => showLogin('Logged out.', false));
  $('refresh').value = sessionStorage.getItem('hutch.refresh') || '5000';
  $('refresh').addEventListener('change', () => {
    sessionStorage.setItem('hutch.refresh', $('refresh').value);
    startTimer();
  });
  $('vhost-select').addEventListener('change', () => {
    const name = $('vhost-select').value;
    if (name) sessionStorage.setItem('hutch.vhost', name); else sessionStorage.removeItem('hutch.vhost');
    route();
  });
  window.addEventListener('hashchange', () => { if (user) route(); });
  if (api.signedIn()) enter().catch((error) => showLogin(error.message)); else showLogin('');
}

start();
