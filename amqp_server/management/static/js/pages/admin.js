// The Admin tab: #/users, #/users/{name}, #/vhosts, #/vhosts/{name},
// #/policies, #/limits (administrators; policies for policymakers too).

import * as api from '../api.js';
import { h, clear, fill, enc, num, link, facts, section, form, table, json, parseObject, CONFIRM_DELETE } from '../dom.js';
import { pagedList } from '../list.js';

const TAGS = ['administrator', 'monitoring', 'policymaker', 'management', 'impersonator'];

function tagList(tags) {
  return (Array.isArray(tags) ? tags : String(tags || '').split(',')).filter(Boolean).join(', ');
}

export async function users(view) {
  const holder = h('div', { id: 'users' });
  const refresh = async () => {
    const [all, permissions] = await Promise.all([api.get('/users'), api.get('/permissions')]);
    clear(holder).append(table([
      ['Name', (u) => link('#/users/' + enc(u.name), u.name)], ['Tags', (u) => tagList(u.tags)],
      ['Can access virtual hosts', (u) => permissions.filter((p) => p.user === u.name).map((p) => p.vhost).join(', ')
                                       || h('span', { class: 'muted' }, 'No access')],
      ['Has password', (u) => (u.password_hash ? 'yes' : 'no')],
    ], all));
  };
  view.append(h('h1', null, 'Users'), holder, section('Add a user', form('add-user', [
    { name: 'username', label: 'Username', required: true },
    { name: 'password', label: 'Password', type: 'password' },
    { name: 'tags', label: 'Tags (comma separated: ' + TAGS.join(', ') + ')', value: 'management' },
  ], 'Add user', async (v) => {
    await api.put('/users/' + enc(v.username), { password: v.password, tags: v.tags });
    await refresh();
    return 'User added.';
  })));
  return refresh;
}

export async function user(view, params, ctx) {
  const path = '/users/' + enc(params.name);
  const info = h('div');
  const perms = h('div');
  const vhosts = (await api.get('/vhosts?columns=name')).map((v) => [v.name, v.name]);
  const shown = await api.get(path);  // the update form starts from what the user has
  const refresh = async () => {
    const u = await api.get(path);
    clear(info).append(facts([['Tags', tagList(u.tags)], ['Limits', json(u.limits)]]));
    fill(perms, table([
      ['Virtual host', (p) => p.vhost], ['Configure', (p) => p.configure], ['Write', (p) => p.write],
      ['Read', (p) => p.read],
      ['', (p) => h('button', { type: 'button', onclick: async () => {
        await api.del('/permissions/' + enc(p.vhost) + '/' + enc(params.name));
        await refresh();
      } }, 'Clear')],
    ], await api.get(path + '/permissions'), 'No permissions'));
  };
  view.append(h('h1', null, 'User ', h('b', null, params.name)), info, section('Permissions', perms,
    form('set-permission', [
      { name: 'vhost', label: 'Virtual host', type: 'select', options: vhosts },
      { name: 'configure', label: 'Configure regexp', value: '.*' },
      { name: 'write', label: 'Write regexp', value: '.*' },
      { name: 'read', label: 'Read regexp', value: '.*' },
    ], 'Set permission', async (v) => {
      await api.put('/permissions/' + enc(v.vhost) + '/' + enc(params.name),
        { configure: v.configure, write: v.write, read: v.read });
      await refresh();
      return 'Permission set.';
    })),
  section('Update this user', form('update-user', [
    { name: 'password', label: 'New password (empty: keep)', type: 'password' },
    { name: 'tags', label: 'Tags (comma separated)', value: tagList(shown.tags), placeholder: TAGS.join(', ') },
  ], 'Update user', async (v) => {
    // RabbitMQ's PUT replaces the user: send what was not changed as it is
    const current = await api.get(path);
    const body = { tags: v.tags };
    if (v.password) body.password = v.password; else body.password_hash = current.password_hash;
    await api.put(path, body);
    // a user changing its own password goes on with the new one
    if (v.password && params.name === ctx.user()) api.signIn(params.name, v.password);
    await refresh();
    return 'User updated.';
  })),
  section('Delete this user', form('delete-user', [], 'Delete user', async () => {
    await api.del(path);
    location.hash = '#/users';
    return 'Deleted.';
  }, CONFIRM_DELETE)));
  return refresh;
}

export async function vhosts(view, _params, ctx) {
  const paged = pagedList('vhosts', () => '/vhosts', [
    { label: 'Name', sort: 'name', cell: (v) => link('#/vhosts/' + enc(v.name), v.name) },
    { label: 'Description', cell: (v) => v.description || '' },
    { label: 'Tags', cell: (v) => tagList(v.tags) },
    { label: 'Ready', sort: 'messages_ready', cell: (v) => num(v.messages_ready), num: true },
    { label: 'Unacked', sort: 'messages_unacknowledged', cell: (v) => num(v.messages_unacknowledged), num: true },
    { label: 'Total', sort: 'messages', cell: (v) => num(v.messages), num: true },
    { label: 'Tracing', cell: (v) => (v.tracing ? 'yes' : '') },
  ]);
  view.append(h('h1', null, 'Virtual hosts'), paged.element, section('Add a new virtual host', form('add-vhost', [
    { name: 'name', label: 'Name', required: true },
    { name: 'description', label: 'Description' },
    { name: 'tags', label: 'Tags (comma separated)' },
  ], 'Add virtual host', async (v) => {
    await api.put('/vhosts/' + enc(v.name), { description: v.description, tags: v.tags });
    await paged.refresh();
    await ctx.vhostsChanged();
    return 'Virtual host added.';
  })));
  return paged.refresh;
}

export async function vhost(view, params, ctx) {
  const path = '/vhosts/' + enc(params.name);
  const info = h('div');
  const perms = h('div');
  const limits = h('div');
  const refresh = async () => {
    const v = await api.get(path);
    clear(info).append(facts([['Description', v.description || ''], ['Tags', tagList(v.tags)],
      ['Messages', num(v.messages)], ['Tracing', v.tracing ? 'yes' : 'no']]));
    fill(perms, table([
      ['User', (p) => link('#/users/' + enc(p.user), p.user)], ['Configure', (p) => p.configure],
      ['Write', (p) => p.write], ['Read', (p) => p.read],
    ], await api.get(path + '/permissions'), 'No permissions'));
    const found = await api.get('/vhost-limits/' + enc(params.name));
    clear(limits).append(facts(Object.entries(found.length ? found[0].value : {}).map(([k, n]) => [k, num(n)])));
  };
  view.append(h('h1', null, 'Virtual host ', h('b', null, params.name)), info, section('Permissions', perms),
    section('Limits', limits), section('Delete this virtual host', form('delete-vhost', [], 'Delete virtual host',
      async () => {
        await api.del(path);
        await ctx.vhostsChanged();
        location.hash = '#/vhosts';
        return 'Deleted.';
      }, CONFIRM_DELETE)));
  return refresh;
}

export async function policies(view, _params, ctx) {
  const holder = h('div', { id: 'policies' });
  const path = () => (ctx.vhost() ? '/policies/' + enc(ctx.vhost()) : '/policies');
  const refresh = async () => {
    fill(holder, table([
      ['Virtual host', (p) => p.vhost], ['Name', (p) => p.name], ['Pattern', (p) => p.pattern],
      ['Apply to', (p) => p['apply-to']], ['Definition', (p) => json(p.definition)],
      ['Priority', (p) => num(p.priority), { num: true }],
      ['', (p) => h('button', { type: 'button', class: 'delete-policy', onclick: async () => {
        if (!window.confirm(CONFIRM_DELETE)) return;
        await api.del('/policies/' + enc(p.vhost) + '/' + enc(p.name));
        await refresh();
      } }, 'Delete')],
    ], await api.get(path()), 'No policies'));
  };
  view.append(h('h1', null, 'Policies'), holder, section('Add / update a policy', form('add-policy', [
    { name: 'vhost', label: 'Virtual host', value: ctx.vhost() || '/', required: true },
    { name: 'name', label: 'Name', required: true },
    { name: 'pattern', label: 'Pattern (regex)', required: true, placeholder: '^amq\\.' },
    { name: 'apply-to', label: 'Apply to', type: 'select', value: 'all',
      options: [['all', 'Exchanges and queues'], ['exchanges', 'Exchanges'], ['queues', 'Queues']] },
    { name: 'priority', label: 'Priority', type: 'number', value: 0 },
    { name: 'definition', label: 'Definition (JSON)', type: 'textarea', placeholder: '{"max-length": 1000}' },
  ], 'Add / update policy', async (v) => {
    await api.put('/policies/' + enc(v.vhost) + '/' + enc(v.name), { pattern: v.pattern, 'apply-to': v['apply-to'],
      priority: Number(v.priority), definition: parseObject(v.definition, 'Definition') });
    await refresh();
    return 'Policy set.';
  })));
  return refresh;
}

export async function limits(view) {
  const vhostHolder = h('div', { id: 'vhost-limits' });
  const userHolder = h('div', { id: 'user-limits' });
  const refresh = async () => {
    const rows = (found, key) => found.flatMap((entry) => Object.entries(entry.value).map(([name, value]) =>
      ({ owner: entry[key], name, value })));
    const remove = (kind) => (r) => h('button', { type: 'button', onclick: async () => {
      await api.del('/' + kind + '-limits/' + enc(r.owner) + '/' + enc(r.name));
      await refresh();
    } }, 'Clear');
    fill(vhostHolder, table([['Virtual host', (r) => r.owner], ['Limit', (r) => r.name],
      ['Value', (r) => num(r.value), { num: true }], ['', remove('vhost')]],
    rows(await api.get('/vhost-limits'), 'vhost'), 'No virtual host limits'));
    fill(userHolder, table([['User', (r) => r.owner], ['Limit', (r) => r.name],
      ['Value', (r) => num(r.value), { num: true }], ['', remove('user')]],
    rows(await api.get('/user-limits'), 'user'), 'No user limits'));
  };
  const limitForm = (kind, owner, names) => form('set-' + kind + '-limit', [
    { name: 'owner', label: owner, required: true },
    { name: 'name', label: 'Limit', type: 'select', options: names.map((n) => [n, n]) },
    { name: 'value', label: 'Value (-1: none)', type: 'number', required: true },
  ], 'Set / update limit', async (v) => {
    await api.put('/' + kind + '-limits/' + enc(v.owner) + '/' + enc(v.name), { value: Number(v.value) });
    await refresh();
    return 'Limit set.';
  });
  view.append(h('h1', null, 'Limits'),
    section('Virtual host limits', vhostHolder, limitForm('vhost', 'Virtual host', ['max-connections', 'max-queues'])),
    section('User limits', userHolder, limitForm('user', 'User', ['max-connections', 'max-channels'])));
  return refresh;
}
