// The management API as the UI uses it: the same authorised calls as any
// client, with HTTP basic credentials kept in sessionStorage only (gone when
// the browser closes, as RabbitMQ's recent UI does).

const KEY = 'hutch.credentials';

export class ApiError extends Error {
  constructor(status, reason) {
    super(reason);
    this.status = status;
  }
}

function encodeCredentials(username, password) {
  const bytes = new TextEncoder().encode(username + ':' + password);
  return btoa(String.fromCharCode(...bytes));
}

export function signIn(username, password) {
  sessionStorage.setItem(KEY, encodeCredentials(username, password));
}

export function signOut() {
  sessionStorage.removeItem(KEY);
}

export function signedIn() {
  return sessionStorage.getItem(KEY) !== null;
}

export async function call(method, path, body, headers = {}) {
  const init = {
    method,
    cache: 'no-store',
    credentials: 'omit',
    headers: { 'X-Requested-With': 'XMLHttpRequest', Authorization: 'Basic ' + sessionStorage.getItem(KEY), ...headers },
  };
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers['Content-Type'] = 'application/json';
  }
  const response = await fetch('api' + path, init);
  const text = await response.text();
  let data = null;
  if (text) {
    try { data = JSON.parse(text); } catch (e) { data = text; }
  }
  if (!response.ok) {
    const reason = data && typeof data === 'object' ? (data.reason || data.error) : response.statusText;
    throw new ApiError(response.status, String(reason || response.status));
  }
  return data;
}

export const get = (path) => call('GET', path);
export const put = (path, body) => call('PUT', path, body === undefined ? {} : body);
export const post = (path, body) => call('POST', path, body);
export const del = (path, headers) => call('DELETE', path, undefined, headers);

// A GET that answers null when the broker does not have the route (404):
// for the parts of the API other brokers or builds may lack.
export async function getOptional(path) {
  try {
    return await get(path);
  } catch (error) {
    if (error.status === 404) return null;
    throw error;
  }
}
