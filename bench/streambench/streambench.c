/*
 * streambench: a load generator for RabbitMQ's stream protocol (port 5552),
 * the stream twin of ../shared/amqpbench (options after RabbitMQ PerfTest
 * and stream-perf-test). Plain sockets, no client library: the frames are
 * PROTOCOL.adoc's (rabbitmq-server deps/rabbitmq_stream/docs/PROTOCOL.adoc).
 *
 * Model
 * - Every producer and every consumer is a thread with its own connection.
 *   Producer j publishes to stream j mod N, consumer i reads stream i mod N
 *   (--streams N; one stream is NAME, several are NAME-1..NAME-N). The
 *   streams are created before the run (unless --predeclared) and deleted
 *   after it (unless --keep). Consumers subscribe before producers start.
 * - A Publish frame carries --batch messages, each an AMQP 1.0 message with
 *   one data section of --size bytes whose first 8 bytes are the send time
 *   (CLOCK_MONOTONIC ns): consumers measure end-to-end latency from it.
 * - Confirms: at most --confirm messages unconfirmed per producer (0: no
 *   window, the broker confirms anyway). Every publishing id must be
 *   confirmed exactly once: an id confirmed twice or never sent is a
 *   protocol error.
 * - Consumers subscribe with --offset first|next and --credit chunks of
 *   credit, and give one credit back per chunk received, as the stream
 *   clients do. Each chunk is checked: user chunk, CRC-32 of its data,
 *   entries that add up to its record count and its data length, and a
 *   first offset equal to where the previous chunk ended (no gap, no
 *   duplicate). Delivered messages are counted from the chunks' entries.
 * - Rates count the measured window (after --warmup, for --duration s).
 *   Then producers stop and wait for their confirms, and consumers read on
 *   until they have every message published to their stream (--drain s at
 *   most); a consumer that falls short is an error. The totals (published,
 *   confirmed, consumed) cover the whole run, so a checker can compare them
 *   with what another client reads from the kept stream.
 * - Errors: a refused login or a failed request (response code != OK), a
 *   PublishError, a MetadataUpdate (stream gone), a Close from the broker, a
 *   malformed chunk, a lost socket: reported in plain words on stderr, and
 *   the exit status is 1 (2 for bad options or a failed setup).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

/* command keys (PROTOCOL.adoc) */
enum {
  K_DECLARE_PUBLISHER = 1, K_PUBLISH = 2, K_PUBLISH_CONFIRM = 3, K_PUBLISH_ERROR = 4, K_DELETE_PUBLISHER = 6,
  K_SUBSCRIBE = 7, K_DELIVER = 8, K_CREDIT = 9, K_UNSUBSCRIBE = 12, K_CREATE = 13, K_DELETE = 14,
  K_METADATA_UPDATE = 16, K_PEER_PROPERTIES = 17, K_SASL_HANDSHAKE = 18, K_SASL_AUTHENTICATE = 19, K_TUNE = 20,
  K_OPEN = 21, K_CLOSE = 22, K_HEARTBEAT = 23
};
#define RESPONSE 0x8000u
#define CODE_OK 1
#define CODE_STREAM_EXISTS 5
#define OFFSET_FIRST 1
#define OFFSET_NEXT 3

static struct {
  const char *host, *user, *password, *vhost, *stream;
  int port, producers, consumers, streams, batch, confirm, credit, offset, json, quiet, keep, predeclared;
  size_t size;
  double duration, warmup, drain;
  uint64_t pmessages, cmessages;
  int broker_pid;
} O = {"127.0.0.1", "guest", "guest", "/", NULL, 5552, 1, 1, 1, 100, 1000, 10, OFFSET_NEXT, 0, 0, 0, 0,
       16, 10, 0, 10, 0, 0, 0};

static atomic_int g_stop;      /* producers stop publishing */
static atomic_int g_measuring; /* record latencies */
static atomic_int g_failed;
static atomic_int g_drained;   /* consumers may stop once they have their expected count */

static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "streambench: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  exit(2);
}

static void *xcalloc(size_t n, size_t size) {
  void *p = calloc(n ? n : 1, size ? size : 1);
  if (!p) die("out of memory");
  return p;
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- latency histogram: log-linear, 64 sub-buckets per power of two (< 1.6 % error), ns ---- */
#define HBUCKETS 3776
typedef struct {
  uint64_t c[HBUCKETS], n, max;
} hist_t;

static inline unsigned hidx(uint64_t v) {
  if (v < 128) return (unsigned)v;
  unsigned msb = 63u - (unsigned)__builtin_clzll(v), shift = msb - 6u;
  return shift * 64u + (unsigned)(v >> shift);
}

static inline uint64_t hval(unsigned i) {
  if (i < 128) return i;
  unsigned shift = i / 64u - 1u;
  return ((uint64_t)(i - shift * 64u) << shift) + ((1ull << shift) >> 1);
}

static inline void hist_add(hist_t *h, uint64_t v) {
  h->c[hidx(v)]++;
  h->n++;
  if (v > h->max) h->max = v;
}

static double hist_pct_ms(const hist_t *h, double p) {
  if (!h->n) return -1;
  uint64_t target = (uint64_t)(p * (double)h->n), cum = 0;
  if (target < 1) target = 1;
  for (unsigned i = 0; i < HBUCKETS; i++) {
    cum += h->c[i];
    if (cum >= target) return (double)(hval(i) < h->max ? hval(i) : h->max) / 1e6;
  }
  return (double)h->max / 1e6;
}

/* ---- encoding ---- */
typedef struct {
  uint8_t *p;
  size_t len, cap;
} buf_t;

static void need(buf_t *b, size_t n) {
  if (b->len + n <= b->cap) return;
  b->cap = (b->len + n) * 2;
  b->p = realloc(b->p, b->cap);
  if (!b->p) die("out of memory");
}
static void put_u8(buf_t *b, uint8_t v) { need(b, 1); b->p[b->len++] = v; }
static void put_u16(buf_t *b, uint16_t v) { need(b, 2); b->p[b->len++] = v >> 8; b->p[b->len++] = (uint8_t)v; }
static void put_u32(buf_t *b, uint32_t v) { put_u16(b, v >> 16); put_u16(b, (uint16_t)v); }
static void put_u64(buf_t *b, uint64_t v) { put_u32(b, v >> 32); put_u32(b, (uint32_t)v); }
static void put_raw(buf_t *b, const void *p, size_t n) { need(b, n); memcpy(b->p + b->len, p, n); b->len += n; }
static void put_str(buf_t *b, const char *s) {
  if (!s) { put_u16(b, 0xffff); return; }
  put_u16(b, (uint16_t)strlen(s));
  put_raw(b, s, strlen(s));
}
/* a frame: start with frame_begin, fill, then frame_end patches the size */
static void frame_begin(buf_t *b, uint16_t key, uint16_t version) { put_u32(b, 0); put_u16(b, key); put_u16(b, version); }
static void frame_end(buf_t *b, size_t start) {
  uint32_t size = (uint32_t)(b->len - start - 4);
  b->p[start] = size >> 24; b->p[start + 1] = size >> 16; b->p[start + 2] = size >> 8; b->p[start + 3] = (uint8_t)size;
}

static inline uint16_t get_u16(const uint8_t *p) { return (uint16_t)(p[0] << 8 | p[1]); }
static inline uint32_t get_u32(const uint8_t *p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]; }
static inline uint64_t get_u64(const uint8_t *p) { return (uint64_t)get_u32(p) << 32 | get_u32(p + 4); }

/* ---- a connection ---- */
typedef struct {
  int fd;
  const char *who; /* "producer 3", for messages */
  uint8_t *in;
  size_t in_len, in_cap, in_pos;
  uint32_t correlation, frame_max;
  buf_t out;
} conn_t;

static int fail(conn_t *c, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "streambench: %s: ", c->who);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  atomic_fetch_add(&g_failed, 1);
  return -1;
}

static int send_all(conn_t *c, const uint8_t *p, size_t n) {
  while (n) {
    ssize_t w = send(c->fd, p, n, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        struct pollfd pfd = {c->fd, POLLOUT, 0};
        poll(&pfd, 1, 100);
        continue;
      }
      return fail(c, "send: %s", strerror(errno));
    }
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

static int flush_out(conn_t *c) {
  int r = c->out.len ? send_all(c, c->out.p, c->out.len) : 0;
  c->out.len = 0;
  return r;
}

/* The next whole frame (its bytes after the size; *len its size), waiting at
 * most timeout_ms for input: 1 a frame, 0 none yet, -1 an error. */
static int next_frame(conn_t *c, int timeout_ms, const uint8_t **frame, uint32_t *len) {
  for (;;) {
    size_t have = c->in_len - c->in_pos;
    if (have >= 4) {
      uint32_t size = get_u32(c->in + c->in_pos);
      /* Deliver frames hold whole chunks, which brokers do not bound by the frame max */
      if (size < 4 || size > (1u << 30)) return fail(c, "the broker sent a frame of %u bytes", size);
      if (have >= 4 + (size_t)size) {
        *frame = c->in + c->in_pos + 4;
        *len = size;
        c->in_pos += 4 + (size_t)size;
        return 1;
      }
      if (4 + (size_t)size > c->in_cap) {
        c->in_cap = 4 + (size_t)size + 65536;
        c->in = realloc(c->in, c->in_cap);
        if (!c->in) die("out of memory");
      }
    }
    if (c->in_pos) { /* keep the partial frame at the start */
      memmove(c->in, c->in + c->in_pos, c->in_len - c->in_pos);
      c->in_len -= c->in_pos;
      c->in_pos = 0;
    }
    struct pollfd pfd = {c->fd, POLLIN, 0};
    int r = poll(&pfd, 1, timeout_ms);
    if (r < 0 && errno != EINTR) return fail(c, "poll: %s", strerror(errno));
    if (r <= 0) return 0;
    ssize_t got = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, 0);
    if (got == 0) return fail(c, "the broker closed the connection");
    if (got < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return fail(c, "recv: %s", strerror(errno));
    }
    c->in_len += (size_t)got;
    timeout_ms = 0; /* more may be there already; do not wait for it */
  }
}

/* Frames every stage must expect: 1 handled, 0 not one of them, -1 fatal. */
static int common_frame(conn_t *c, uint16_t key, const uint8_t *f, uint32_t len) {
  if (key == K_HEARTBEAT) return 1;
  if (key == K_CLOSE && len >= 10) {
    uint16_t code = get_u16(f + 8);
    int rlen = len >= 12 ? (int16_t)get_u16(f + 10) : 0;
    if (rlen < 0 || 12u + (unsigned)rlen > len) rlen = 0;
    return fail(c, "the broker closed the connection: code %u %.*s", code, rlen, (const char *)f + 12);
  }
  if (key == K_METADATA_UPDATE && len >= 6) {
    int slen = len >= 8 ? (int16_t)get_u16(f + 6) : 0;
    if (slen < 0 || 8u + (unsigned)slen > len) slen = 0;
    return fail(c, "metadata update code %u for stream %.*s (stream deleted?)", get_u16(f + 4), slen,
                (const char *)f + 8);
  }
  return 0;
}

/* Send the request in c->out and wait for its response; returns the
 * response code (and the frame in *resp) or -1. */
static int request(conn_t *c, uint16_t key, const uint8_t **resp, uint32_t *resp_len) {
  uint32_t correlation = c->correlation;
  if (flush_out(c) < 0) return -1;
  uint64_t deadline = now_ns() + 30000000000ull;
  while (now_ns() < deadline) {
    const uint8_t *f;
    uint32_t len;
    int r = next_frame(c, 100, &f, &len);
    if (r < 0) return -1;
    if (!r) continue;
    uint16_t k = get_u16(f);
    if (k == (key | RESPONSE) && len >= 10 && get_u32(f + 4) == correlation) {
      if (resp) { *resp = f; *resp_len = len; }
      return get_u16(f + 8);
    }
    if (k == K_TUNE && key == K_SASL_AUTHENTICATE) { /* cannot come before the answer */
      return fail(c, "Tune before the SASL answer");
    }
    int handled = common_frame(c, k, f, len);
    if (handled < 0) return -1;
    if (!handled) return fail(c, "unexpected frame key 0x%04x while waiting for 0x%04x", k, key | RESPONSE);
  }
  return fail(c, "no answer to request 0x%04x within 30 s", key);
}

static size_t begin_request(conn_t *c, uint16_t key) {
  size_t start = c->out.len;
  frame_begin(&c->out, key, 1);
  put_u32(&c->out, ++c->correlation);
  return start;
}

static int connect_to(conn_t *c, const char *who) {
  memset(c, 0, sizeof *c);
  c->who = who;
  c->in_cap = 1 << 20;
  c->in = xcalloc(1, c->in_cap);
  c->frame_max = 1 << 20;
  char port[16];
  snprintf(port, sizeof port, "%d", O.port);
  struct addrinfo hints = {0}, *ai;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  int e = getaddrinfo(O.host, port, &hints, &ai);
  if (e) return fail(c, "cannot resolve %s: %s", O.host, gai_strerror(e));
  c->fd = socket(ai->ai_family, ai->ai_socktype, 0);
  if (c->fd < 0 || connect(c->fd, ai->ai_addr, ai->ai_addrlen) < 0) {
    freeaddrinfo(ai);
    return fail(c, "cannot connect to %s:%d: %s", O.host, O.port, strerror(errno));
  }
  freeaddrinfo(ai);
  int one = 1;
  setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  const uint8_t *f;
  uint32_t len;
  /* peer properties */
  size_t s = begin_request(c, K_PEER_PROPERTIES);
  put_u32(&c->out, 2);
  put_str(&c->out, "product");
  put_str(&c->out, "streambench");
  put_str(&c->out, "connection_name");
  put_str(&c->out, who);
  frame_end(&c->out, s);
  int code = request(c, K_PEER_PROPERTIES, &f, &len);
  if (code != CODE_OK) return code < 0 ? -1 : fail(c, "peer properties: response code %d", code);
  s = begin_request(c, K_SASL_HANDSHAKE);
  frame_end(&c->out, s);
  code = request(c, K_SASL_HANDSHAKE, &f, &len);
  if (code != CODE_OK) return code < 0 ? -1 : fail(c, "SASL handshake: response code %d", code);
  s = begin_request(c, K_SASL_AUTHENTICATE);
  put_str(&c->out, "PLAIN");
  size_t ul = strlen(O.user), pl = strlen(O.password);
  put_u32(&c->out, (uint32_t)(ul + pl + 2));
  put_u8(&c->out, 0);
  put_raw(&c->out, O.user, ul);
  put_u8(&c->out, 0);
  put_raw(&c->out, O.password, pl);
  frame_end(&c->out, s);
  code = request(c, K_SASL_AUTHENTICATE, &f, &len);
  if (code != CODE_OK) return code < 0 ? -1 : fail(c, "login of user '%s' refused: response code %d", O.user, code);
  /* the broker's Tune; answer with its frame max and no heartbeat */
  for (;;) {
    int r = next_frame(c, 30000, &f, &len);
    if (r <= 0) return r < 0 ? -1 : fail(c, "no Tune from the broker");
    if (get_u16(f) == K_TUNE && len >= 12) break;
    if (common_frame(c, get_u16(f), f, len) < 0) return -1;
  }
  uint32_t frame_max = get_u32(f + 4);
  c->frame_max = frame_max ? frame_max : (1u << 20);
  s = c->out.len;
  frame_begin(&c->out, K_TUNE, 1);
  put_u32(&c->out, frame_max);
  put_u32(&c->out, 0);
  frame_end(&c->out, s);
  s = begin_request(c, K_OPEN);
  put_str(&c->out, O.vhost);
  frame_end(&c->out, s);
  code = request(c, K_OPEN, &f, &len);
  if (code != CODE_OK) return code < 0 ? -1 : fail(c, "open of vhost '%s': response code %d", O.vhost, code);
  return 0;
}

static void disconnect(conn_t *c) {
  if (c->fd > 0) {
    size_t s = begin_request(c, K_CLOSE);
    put_u16(&c->out, CODE_OK);
    put_str(&c->out, "streambench done");
    frame_end(&c->out, s);
    flush_out(c); /* the answer is not awaited */
    close(c->fd);
  }
  free(c->in);
  free(c->out.p);
  c->fd = -1;
}

static char *stream_name(int i) { /* stream of index i (0-based) */
  char *name = xcalloc(1, strlen(O.stream) + 16);
  if (O.streams == 1) strcpy(name, O.stream);
  else sprintf(name, "%s-%d", O.stream, i + 1);
  return name;
}

/* ---- producers ---- */
typedef struct {
  int index;
  pthread_t thread;
  char who[32];
  atomic_uint_fast64_t published, confirmed; /* whole run */
  hist_t clat;                               /* confirm latency */
  int ok;
} producer_t;

static void *producer_main(void *arg) {
  producer_t *p = arg;
  conn_t c;
  char *stream = stream_name(p->index % O.streams);
  if (connect_to(&c, p->who) < 0) goto out;
  size_t s = begin_request(&c, K_DECLARE_PUBLISHER);
  put_u8(&c.out, 0);
  put_str(&c.out, ""); /* no reference (RabbitMQ 3.10 refuses a null string) */
  put_str(&c.out, stream);
  frame_end(&c.out, s);
  int code = request(&c, K_DECLARE_PUBLISHER, NULL, NULL);
  if (code != CODE_OK) {
    if (code >= 0) fail(&c, "declare publisher on '%s': response code %d", stream, code);
    goto out;
  }
  /* The unconfirmed window: ids [lowest, next) are sent, done[] marks the
   * confirmed ones among them (a ring of `ring` slots), sent_at their send time. */
  uint64_t ring = O.confirm ? (uint64_t)O.confirm : (1u << 20);
  if (ring < (uint64_t)O.batch) ring = (uint64_t)O.batch;
  uint8_t *done = xcalloc(ring, 1);
  uint64_t *sent_at = xcalloc(ring, sizeof(uint64_t));
  uint64_t lowest = 1, next = 1; /* publishing ids from 1 */
  /* one message: AMQP 1.0 data section (described type 0x75) of O.size bytes */
  buf_t msg = {0};
  put_u8(&msg, 0x00); put_u8(&msg, 0x53); put_u8(&msg, 0x75);
  if (O.size < 256) { put_u8(&msg, 0xa0); put_u8(&msg, (uint8_t)O.size); }
  else { put_u8(&msg, 0xb0); put_u32(&msg, (uint32_t)O.size); }
  size_t body_at = msg.len;
  need(&msg, O.size);
  memset(msg.p + msg.len, 'x', O.size);
  msg.len += O.size;
  uint64_t limit = O.pmessages;
  while (!atomic_load(&g_stop) && (!limit || next - 1 < limit)) {
    uint64_t room = ring - (next - lowest);
    uint64_t n = room < (uint64_t)O.batch ? room : (uint64_t)O.batch;
    if (limit && n > limit - (next - 1)) n = limit - (next - 1);
    if (n) {
      size_t start = c.out.len;
      frame_begin(&c.out, K_PUBLISH, 1);
      put_u8(&c.out, 0);
      put_u32(&c.out, (uint32_t)n);
      uint64_t t = now_ns();
      for (uint64_t i = 0; i < n; i++, next++) {
        put_u64(&c.out, next);
        put_u32(&c.out, (uint32_t)msg.len);
        size_t at = c.out.len;
        put_raw(&c.out, msg.p, msg.len);
        if (O.size >= 8) memcpy(c.out.p + at + body_at, &t, 8);
        sent_at[next % ring] = t;
      }
      frame_end(&c.out, start);
      if (flush_out(&c) < 0) goto out;
      atomic_fetch_add(&p->published, n);
    }
    /* read what has come (confirms); wait when the window is full */
    int timeout = (next - lowest >= ring) ? 100 : 0;
    for (;;) {
      const uint8_t *f;
      uint32_t len;
      int r = next_frame(&c, timeout, &f, &len);
      if (r < 0) goto out;
      if (!r) break;
      timeout = 0;
      uint16_t key = get_u16(f);
      if (key == K_PUBLISH_CONFIRM && len >= 9) {
        uint32_t count = get_u32(f + 5);
        if (9 + (uint64_t)count * 8 != len) { fail(&c, "a PublishConfirm of %u ids in %u bytes", count, len); goto out; }
        uint64_t t = now_ns();
        int measuring = atomic_load_explicit(&g_measuring, memory_order_relaxed);
        for (uint32_t i = 0; i < count; i++) {
          uint64_t id = get_u64(f + 9 + 8 * i);
          if (id < lowest || id >= next || done[id % ring]) {
            fail(&c, "publishing id %llu confirmed %s", (unsigned long long)id,
                 id >= next ? "but never sent" : "twice");
            goto out;
          }
          done[id % ring] = 1;
          if (measuring) hist_add(&p->clat, t - sent_at[id % ring]);
        }
        while (lowest < next && done[lowest % ring]) done[lowest++ % ring] = 0;
        atomic_fetch_add(&p->confirmed, count);
      } else if (key == K_PUBLISH_ERROR && len >= 9) {
        fail(&c, "PublishError: %u message(s), the first id %llu code %u", get_u32(f + 5),
             (unsigned long long)(len >= 19 ? get_u64(f + 9) : 0), len >= 19 ? get_u16(f + 17) : 0);
        goto out;
      } else {
        int handled = common_frame(&c, key, f, len);
        if (handled <= 0) {
          if (!handled) fail(&c, "unexpected frame key 0x%04x", key);
          goto out;
        }
      }
    }
  }
  /* wait for the last confirms */
  uint64_t deadline = now_ns() + (uint64_t)(O.drain * 1e9);
  while (lowest < next && now_ns() < deadline) {
    const uint8_t *f;
    uint32_t len;
    int r = next_frame(&c, 100, &f, &len);
    if (r < 0) goto out;
    if (!r) continue;
    uint16_t key = get_u16(f);
    if (key == K_PUBLISH_CONFIRM && len >= 9) {
      uint32_t count = get_u32(f + 5);
      if (9 + (uint64_t)count * 8 != len) { fail(&c, "a PublishConfirm of %u ids in %u bytes", count, len); goto out; }
      for (uint32_t i = 0; i < count; i++) {
        uint64_t id = get_u64(f + 9 + 8 * i);
        if (id < lowest || id >= next || done[id % ring]) { fail(&c, "publishing id %llu confirmed twice or never sent", (unsigned long long)id); goto out; }
        done[id % ring] = 1;
      }
      while (lowest < next && done[lowest % ring]) done[lowest++ % ring] = 0;
      atomic_fetch_add(&p->confirmed, count);
    } else if (common_frame(&c, key, f, len) <= 0) {
      fail(&c, "unexpected frame key 0x%04x while waiting for confirms", key);
      goto out;
    }
  }
  if (lowest < next) { fail(&c, "%llu message(s) unconfirmed after %.0f s", (unsigned long long)(next - lowest), O.drain); goto out; }
  p->ok = 1;
out:
  disconnect(&c);
  free(stream);
  return NULL;
}

/* ---- consumers ---- */
typedef struct {
  int index;
  pthread_t thread;
  char who[32];
  atomic_uint_fast64_t consumed, chunks; /* whole run */
  atomic_uint_fast64_t expected;         /* set by main once producers are done */
  hist_t lat;
  int ok, subscribed;
} consumer_t;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static int g_ready; /* consumers subscribed (or failed) */
static int g_go;    /* the run starts: consumers read what came, producers publish */

static void consumer_ready(consumer_t *w) {
  pthread_mutex_lock(&g_mu);
  g_ready++;
  pthread_cond_broadcast(&g_cv);
  pthread_mutex_unlock(&g_mu);
  (void)w;
}

/* Check one Deliver's chunk and count its records; -1 on a malformed one. */
static int on_deliver(conn_t *c, consumer_t *w, const uint8_t *f, uint32_t len, uint64_t *expect_offset) {
  uint16_t version = get_u16(f + 2);
  uint32_t at = 5 + (version >= 2 ? 8 : 0); /* key, version, subscription id [, committed offset] */
  if (len < at + 48) return fail(c, "a Deliver of %u bytes", len);
  const uint8_t *h = f + at;
  if (h[0] != 0x50 && h[0] != 0x51) return fail(c, "chunk magic/version 0x%02x", h[0]);
  if (h[1] != 0) return fail(c, "chunk type %u (not a user chunk)", h[1]);
  uint16_t entries = get_u16(h + 2);
  uint32_t records = get_u32(h + 4);
  uint64_t first = get_u64(h + 24);
  uint32_t crc = get_u32(h + 32), data_len = get_u32(h + 36), trailer_len = get_u32(h + 40);
  if ((uint64_t)at + 48 + data_len + trailer_len != len && (uint64_t)at + 48 + data_len != len)
    return fail(c, "chunk at offset %llu: data %u + trailer %u bytes in a frame of %u", (unsigned long long)first,
                data_len, trailer_len, len);
  const uint8_t *d = h + 48;
  if ((uint32_t)crc32(0, d, data_len) != crc) return fail(c, "chunk at offset %llu: CRC mismatch", (unsigned long long)first);
  if (*expect_offset != UINT64_MAX && first != *expect_offset)
    return fail(c, "chunk at offset %llu, expected %llu (%s)", (unsigned long long)first,
                (unsigned long long)*expect_offset, first > *expect_offset ? "a gap" : "a duplicate");
  uint64_t t = now_ns();
  int measuring = atomic_load_explicit(&g_measuring, memory_order_relaxed);
  uint32_t pos = 0, counted = 0;
  for (uint16_t e = 0; e < entries; e++) {
    if (pos + 4 > data_len) return fail(c, "chunk at offset %llu ends inside entry %u", (unsigned long long)first, e);
    uint32_t head = get_u32(d + pos);
    if (head & 0x80000000u) { /* a sub-entry batch: type, count u16, uncompressed u32, size u32 */
      if (pos + 11 > data_len) return fail(c, "chunk ends inside a sub-entry header");
      uint16_t n = get_u16(d + pos + 1);
      uint32_t size = get_u32(d + pos + 7);
      counted += n;
      pos += 11 + size;
    } else {
      const uint8_t *m = d + pos + 4;
      /* our message: 00 53 75 a0 <u8> body, or b0 <u32> body; the body starts with the send time */
      if (measuring && head >= 13 && m[0] == 0 && m[1] == 0x53 && m[2] == 0x75) {
        size_t b = m[3] == 0xa0 ? 5 : m[3] == 0xb0 ? 8 : 0;
        if (b && head >= b + 8) {
          uint64_t sent;
          memcpy(&sent, m + b, 8);
          if (sent && sent <= t) hist_add(&w->lat, t - sent);
        }
      }
      counted++;
      pos += 4 + head;
    }
  }
  if (pos != data_len || counted != records)
    return fail(c, "chunk at offset %llu: %u entries hold %u records in %u bytes, its header says %u in %u",
                (unsigned long long)first, entries, counted, pos, records, data_len);
  *expect_offset = first + records;
  atomic_fetch_add(&w->consumed, records);
  atomic_fetch_add(&w->chunks, 1);
  return 0;
}

static void *consumer_main(void *arg) {
  consumer_t *w = arg;
  conn_t c;
  char *stream = stream_name(w->index % O.streams);
  if (connect_to(&c, w->who) < 0) { consumer_ready(w); goto out; }
  size_t s = begin_request(&c, K_SUBSCRIBE);
  put_u8(&c.out, 0);
  put_str(&c.out, stream);
  put_u16(&c.out, (uint16_t)O.offset);
  put_u16(&c.out, (uint16_t)O.credit);
  put_u32(&c.out, 0);
  frame_end(&c.out, s);
  int code = request(&c, K_SUBSCRIBE, NULL, NULL);
  if (code != CODE_OK) {
    if (code >= 0) fail(&c, "subscribe to '%s': response code %d", stream, code);
    consumer_ready(w);
    goto out;
  }
  w->subscribed = 1;
  consumer_ready(w);
  /* chunks the broker sends meanwhile wait in the socket (at most the credit), so with
   * --offset first the measured window sees the whole read */
  pthread_mutex_lock(&g_mu);
  while (!g_go) pthread_cond_wait(&g_cv, &g_mu);
  pthread_mutex_unlock(&g_mu);
  uint64_t expect_offset = UINT64_MAX, drain_deadline = 0;
  for (;;) {
    if (atomic_load(&g_drained)) {
      uint64_t want = atomic_load(&w->expected);
      if (atomic_load(&w->consumed) >= want) break;
      if (!drain_deadline) drain_deadline = now_ns() + (uint64_t)(O.drain * 1e9);
      else if (now_ns() > drain_deadline) {
        fail(&c, "read %llu message(s) of the %llu expected from '%s' within %.0f s",
             (unsigned long long)atomic_load(&w->consumed), (unsigned long long)want, stream, O.drain);
        goto out;
      }
    }
    const uint8_t *f;
    uint32_t len;
    unsigned credit = 0;
    int r = next_frame(&c, 100, &f, &len);
    while (r > 0) {
      uint16_t key = get_u16(f);
      if (key == K_DELIVER) {
        if (len < 5 || on_deliver(&c, w, f, len, &expect_offset) < 0) goto out;
        credit++;
      } else if (key == (K_CREDIT | RESPONSE)) {
        fail(&c, "credit refused: response code %u", len >= 6 ? get_u16(f + 4) : 0);
        goto out;
      } else {
        int handled = common_frame(&c, key, f, len);
        if (handled <= 0) {
          if (!handled) fail(&c, "unexpected frame key 0x%04x", key);
          goto out;
        }
      }
      r = next_frame(&c, 0, &f, &len);
    }
    if (r < 0) goto out;
    if (credit) { /* one credit back per chunk received */
      size_t st = c.out.len;
      frame_begin(&c.out, K_CREDIT, 1);
      put_u8(&c.out, 0);
      put_u16(&c.out, (uint16_t)credit);
      frame_end(&c.out, st);
      if (flush_out(&c) < 0) goto out;
    }
  }
  w->ok = 1;
out:
  disconnect(&c);
  free(stream);
  return NULL;
}

/* ---- streams ---- */
static int manage_streams(int create) {
  conn_t c;
  if (connect_to(&c, create ? "stream setup" : "stream clean-up") < 0) return -1;
  int rc = 0;
  for (int i = 0; i < O.streams && !rc; i++) {
    char *name = stream_name(i);
    size_t s = begin_request(&c, create ? K_CREATE : K_DELETE);
    put_str(&c.out, name);
    if (create) put_u32(&c.out, 0);
    frame_end(&c.out, s);
    int code = request(&c, create ? K_CREATE : K_DELETE, NULL, NULL);
    if (code != CODE_OK) rc = code < 0 ? -1 : fail(&c, "%s stream '%s': response code %d", create ? "create" : "delete",
                                                   name, code);
    free(name);
  }
  disconnect(&c);
  return rc;
}

/* ---- CPU sampling ---- */
static double proc_cpu_s(int pid) { /* user + system seconds of a process, every thread */
  char path[64], line[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  size_t n = fread(line, 1, sizeof line - 1, f);
  fclose(f);
  line[n] = 0;
  char *p = strrchr(line, ')');
  unsigned long utime, stime;
  if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &utime, &stime) != 2) return -1;
  return (double)(utime + stime) / (double)sysconf(_SC_CLK_TCK);
}

static double self_cpu_s(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
}

typedef struct {
  uint64_t published, confirmed, consumed;
  double broker_cpu, client_cpu;
  uint64_t at;
} sample_t;

static producer_t *P;
static consumer_t *C;

static void sample(sample_t *s) {
  memset(s, 0, sizeof *s);
  for (int i = 0; i < O.producers; i++) {
    s->published += atomic_load(&P[i].published);
    s->confirmed += atomic_load(&P[i].confirmed);
  }
  for (int i = 0; i < O.consumers; i++) s->consumed += atomic_load(&C[i].consumed);
  s->broker_cpu = O.broker_pid ? proc_cpu_s(O.broker_pid) : -1;
  s->client_cpu = self_cpu_s();
  s->at = now_ns();
}

static void on_signal(int sig) {
  (void)sig;
  atomic_store(&g_stop, 1);
}

static void usage(void) {
  printf("usage: streambench [options]\n"
         "  --uri URI            rabbitmq-stream://USER:PASS@HOST:PORT/VHOST (%%2f for /)\n"
         "  --host H --port N --user U --password P --vhost V   (127.0.0.1 5552 guest guest /)\n"
         "  --stream NAME        stream name (default streambench-PID); with --streams N: NAME-1..NAME-N\n"
         "  --streams N          streams (default 1); producer j and consumer i use stream j, i mod N\n"
         "  --producers N        (default 1)          --consumers N   (default 1)\n"
         "  --size BYTES         message body bytes (default 16; >= 8 for latency)\n"
         "  --batch N            messages per Publish frame (default 100)\n"
         "  --confirm N          at most N unconfirmed messages per producer (default 1000; 0: no window)\n"
         "  --offset first|next  where consumers start (default next)\n"
         "  --credit N           initial credit in chunks (default 10); one back per chunk\n"
         "  --duration S         measured seconds (default 10; --time too)   --warmup S (default 0)\n"
         "  --pmessages N        each producer publishes N messages and stops (with --duration as a cap)\n"
         "  --cmessages N        each consumer expects N messages (default: what was published to its\n"
         "                       stream); with --producers 0 and --offset first, reads a filled stream\n"
         "  --drain S            after the run, seconds to wait for confirms and consumers (default 10)\n"
         "  --predeclared        the streams exist: neither create nor delete them\n"
         "  --keep               do not delete the streams at the end\n"
         "  --broker-pid PID     sample the broker's CPU (/proc/PID/stat)\n"
         "  --json               one JSON line on stdout      --quiet   no progress on stderr\n");
}

static int pct_decode(char *s) { /* in place; -1 on a bad escape */
  char *o = s;
  for (; *s; s++) {
    if (*s == '%') {
      unsigned v;
      if (!s[1] || !s[2] || sscanf(s + 1, "%2x", &v) != 1) return -1;
      *o++ = (char)v;
      s += 2;
    } else *o++ = *s;
  }
  *o = 0;
  return 0;
}

static void parse_uri(const char *uri) {
  const char *scheme = "rabbitmq-stream://";
  if (strncmp(uri, scheme, strlen(scheme))) die("--uri must start with %s", scheme);
  char *s = strdup(uri + strlen(scheme)), *at = strrchr(s, '@'), *hostport = s, *slash;
  if (at) {
    *at = 0;
    hostport = at + 1;
    char *colon = strchr(s, ':');
    if (colon) { *colon = 0; O.password = strdup(colon + 1); if (pct_decode((char *)O.password)) die("bad %% escape in --uri"); }
    O.user = strdup(s);
    if (pct_decode((char *)O.user)) die("bad %% escape in --uri");
  }
  slash = strchr(hostport, '/');
  if (slash) {
    *slash = 0;
    if (slash[1]) { O.vhost = strdup(slash + 1); if (pct_decode((char *)O.vhost)) die("bad %% escape in --uri"); }
  }
  char *colon = strrchr(hostport, ':');
  if (colon) { *colon = 0; O.port = atoi(colon + 1); }
  if (*hostport) O.host = strdup(hostport);
}

static double number(const char *s, const char *opt) {
  char *end;
  double v = strtod(s, &end);
  if (*end || v < 0) die("%s needs a number >= 0, not '%s'", opt, s);
  return v;
}

int main(int argc, char **argv) {
  static struct option opts[] = {
      {"uri", 1, 0, 'U'}, {"host", 1, 0, 'h'}, {"port", 1, 0, 'p'}, {"user", 1, 0, 'u'}, {"password", 1, 0, 'w'},
      {"vhost", 1, 0, 'v'}, {"stream", 1, 0, 's'}, {"streams", 1, 0, 'S'}, {"producers", 1, 0, 'x'},
      {"consumers", 1, 0, 'y'}, {"size", 1, 0, 'z'}, {"batch", 1, 0, 'b'}, {"confirm", 1, 0, 'c'},
      {"offset", 1, 0, 'o'}, {"credit", 1, 0, 'C'}, {"duration", 1, 0, 'd'}, {"time", 1, 0, 'd'},
      {"warmup", 1, 0, 'W'}, {"pmessages", 1, 0, 'm'}, {"cmessages", 1, 0, 'M'}, {"drain", 1, 0, 'D'}, {"predeclared", 0, 0, 'P'},
      {"keep", 0, 0, 'k'}, {"broker-pid", 1, 0, 'B'}, {"json", 0, 0, 'j'}, {"quiet", 0, 0, 'q'},
      {"help", 0, 0, 'H'}, {0, 0, 0, 0}};
  int o;
  while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
    switch (o) {
      case 'U': parse_uri(optarg); break;
      case 'h': O.host = optarg; break;
      case 'p': O.port = (int)number(optarg, "--port"); break;
      case 'u': O.user = optarg; break;
      case 'w': O.password = optarg; break;
      case 'v': O.vhost = optarg; break;
      case 's': O.stream = optarg; break;
      case 'S': O.streams = (int)number(optarg, "--streams"); break;
      case 'x': O.producers = (int)number(optarg, "--producers"); break;
      case 'y': O.consumers = (int)number(optarg, "--consumers"); break;
      case 'z': O.size = (size_t)number(optarg, "--size"); break;
      case 'b': O.batch = (int)number(optarg, "--batch"); break;
      case 'c': O.confirm = (int)number(optarg, "--confirm"); break;
      case 'o':
        if (!strcmp(optarg, "first")) O.offset = OFFSET_FIRST;
        else if (!strcmp(optarg, "next")) O.offset = OFFSET_NEXT;
        else die("--offset must be first or next");
        break;
      case 'C': O.credit = (int)number(optarg, "--credit"); break;
      case 'd': O.duration = number(optarg, "--duration"); break;
      case 'W': O.warmup = number(optarg, "--warmup"); break;
      case 'm': O.pmessages = (uint64_t)number(optarg, "--pmessages"); break;
      case 'M': O.cmessages = (uint64_t)number(optarg, "--cmessages"); break;
      case 'D': O.drain = number(optarg, "--drain"); break;
      case 'P': O.predeclared = 1; break;
      case 'k': O.keep = 1; break;
      case 'B': O.broker_pid = (int)number(optarg, "--broker-pid"); break;
      case 'j': O.json = 1; break;
      case 'q': O.quiet = 1; break;
      case 'H': usage(); return 0;
      default: usage(); return 2;
    }
  }
  if (optind < argc) die("unexpected argument '%s' (see --help)", argv[optind]);
  if (O.streams < 1) die("--streams must be at least 1");
  if (O.batch < 1 || O.batch > 65535) die("--batch must be 1..65535");
  if (O.credit < 1 || O.credit > 65535) die("--credit must be 1..65535");
  if (O.confirm && O.confirm < O.batch) die("--confirm (%d) must be 0 or at least --batch (%d)", O.confirm, O.batch);
  if (O.size > 64 * 1024 * 1024) die("--size too large");
  if (O.producers + O.consumers < 1) die("nothing to do: no producers and no consumers");
  char default_name[64];
  if (!O.stream) {
    snprintf(default_name, sizeof default_name, "streambench-%d", (int)getpid());
    O.stream = default_name;
  }
  signal(SIGINT, on_signal);
  signal(SIGTERM, on_signal);
  signal(SIGPIPE, SIG_IGN);
  if (!O.predeclared && manage_streams(1) < 0) return 2;
  P = xcalloc((size_t)O.producers, sizeof *P);
  C = xcalloc((size_t)O.consumers, sizeof *C);
  for (int i = 0; i < O.consumers; i++) {
    C[i].index = i;
    snprintf(C[i].who, sizeof C[i].who, "consumer %d", i + 1);
    if (pthread_create(&C[i].thread, NULL, consumer_main, &C[i])) die("cannot start a thread");
  }
  pthread_mutex_lock(&g_mu);
  while (g_ready < O.consumers) pthread_cond_wait(&g_cv, &g_mu);
  g_go = 1;
  pthread_cond_broadcast(&g_cv);
  pthread_mutex_unlock(&g_mu);
  int setup_failed = atomic_load(&g_failed);
  if (!setup_failed) {
    for (int i = 0; i < O.producers; i++) {
      P[i].index = i;
      snprintf(P[i].who, sizeof P[i].who, "producer %d", i + 1);
      if (pthread_create(&P[i].thread, NULL, producer_main, &P[i])) die("cannot start a thread");
    }
  } else {
    atomic_store(&g_stop, 1);
    O.producers = 0;
  }
  sample_t s0, s1, last;
  uint64_t start = now_ns(), measure_at = start + (uint64_t)(O.warmup * 1e9),
           end_at = measure_at + (uint64_t)(O.duration * 1e9);
  int measuring = 0;
  sample(&last);
  s0 = last;
  while (!atomic_load(&g_stop) && !atomic_load(&g_failed)) {
    uint64_t t = now_ns();
    if (!measuring && t >= measure_at) {
      sample(&s0);
      measuring = 1;
      atomic_store(&g_measuring, 1);
    }
    if (t >= end_at) break;
    if (O.pmessages || O.cmessages) { /* a counted run ends when every message is confirmed and consumed */
      sample_t s;
      sample(&s);
      if ((!O.pmessages || s.confirmed >= O.pmessages * (uint64_t)O.producers) &&
          (!O.cmessages || s.consumed >= O.cmessages * (uint64_t)O.consumers))
        break;
    }
    uint64_t step = O.pmessages || O.cmessages ? 5000000ull : 100000000ull; /* counted runs end promptly */
    uint64_t wait = end_at - t < step ? end_at - t : step;
    struct timespec ts = {0, (long)wait};
    nanosleep(&ts, NULL);
    if (!O.quiet && now_ns() - last.at >= 1000000000ull) {
      sample_t s;
      sample(&s);
      double dt = (double)(s.at - last.at) / 1e9;
      fprintf(stderr, "%6.1f s  published %9.0f/s  confirmed %9.0f/s  consumed %9.0f/s\n", (s.at - start) / 1e9,
              (s.published - last.published) / dt, (s.confirmed - last.confirmed) / dt, (s.consumed - last.consumed) / dt);
      last = s;
    }
  }
  if (!measuring) { sample(&s0); atomic_store(&g_measuring, 1); }
  sample(&s1);
  atomic_store(&g_measuring, 0);
  atomic_store(&g_stop, 1);
  /* producers finish (their last confirms), then consumers read what was published to their stream */
  uint64_t *per_stream = xcalloc((size_t)O.streams, sizeof(uint64_t));
  for (int i = 0; i < O.producers; i++) {
    pthread_join(P[i].thread, NULL);
    per_stream[i % O.streams] += atomic_load(&P[i].published);
  }
  for (int i = 0; i < O.consumers; i++) atomic_store(&C[i].expected, O.cmessages ? O.cmessages : per_stream[i % O.streams]);
  atomic_store(&g_drained, 1);
  for (int i = 0; i < O.consumers; i++) pthread_join(C[i].thread, NULL);
  sample_t total;
  sample(&total);
  int errors = atomic_load(&g_failed);
  if (!O.predeclared && !O.keep && manage_streams(0) < 0) errors++;
  double window = (double)(s1.at - s0.at) / 1e9;
  double messages = (double)(s1.consumed - s0.consumed) ? (double)(s1.consumed - s0.consumed)
                                                        : (double)(s1.confirmed - s0.confirmed);
  double broker_cpu = (O.broker_pid && s0.broker_cpu >= 0 && s1.broker_cpu >= 0) ? s1.broker_cpu - s0.broker_cpu : -1;
  hist_t *lat = xcalloc(1, sizeof *lat), *clat = xcalloc(1, sizeof *clat);
  for (int i = 0; i < O.consumers; i++) {
    for (unsigned b = 0; b < HBUCKETS; b++) lat->c[b] += C[i].lat.c[b];
    lat->n += C[i].lat.n;
    if (C[i].lat.max > lat->max) lat->max = C[i].lat.max;
  }
  for (int i = 0; i < O.producers; i++) {
    for (unsigned b = 0; b < HBUCKETS; b++) clat->c[b] += P[i].clat.c[b];
    clat->n += P[i].clat.n;
    if (P[i].clat.max > clat->max) clat->max = P[i].clat.max;
  }
  double rp = (s1.published - s0.published) / window, rc = (s1.confirmed - s0.confirmed) / window,
         rr = (s1.consumed - s0.consumed) / window;
  if (O.json) {
    printf("{\"producers\": %d, \"consumers\": %d, \"streams\": %d, \"size\": %zu, \"batch\": %d, \"confirm\": %d, "
           "\"credit\": %d, \"offset\": \"%s\", \"seconds\": %.3f, \"publish_rate\": %.1f, \"confirm_rate\": %.1f, "
           "\"consume_rate\": %.1f, \"published\": %llu, \"confirmed\": %llu, \"consumed\": %llu, "
           "\"latency_ms\": {\"p50\": %.3f, \"p95\": %.3f, \"p99\": %.3f, \"max\": %.3f, \"n\": %llu}, "
           "\"confirm_latency_ms\": {\"p50\": %.3f, \"p95\": %.3f, \"p99\": %.3f, \"max\": %.3f, \"n\": %llu}, "
           "\"broker_cpu_pct\": %.1f, \"broker_cpu_us_per_msg\": %.3f, \"client_cpu_pct\": %.1f, \"errors\": %d}\n",
           O.producers, O.consumers, O.streams, O.size, O.batch, O.confirm, O.credit,
           O.offset == OFFSET_FIRST ? "first" : "next", window, rp, rc, rr, (unsigned long long)total.published,
           (unsigned long long)total.confirmed, (unsigned long long)total.consumed, hist_pct_ms(lat, 0.5),
           hist_pct_ms(lat, 0.95), hist_pct_ms(lat, 0.99), lat->n ? lat->max / 1e6 : -1, (unsigned long long)lat->n,
           hist_pct_ms(clat, 0.5), hist_pct_ms(clat, 0.95), hist_pct_ms(clat, 0.99), clat->n ? clat->max / 1e6 : -1,
           (unsigned long long)clat->n, broker_cpu >= 0 ? 100 * broker_cpu / window : -1,
           broker_cpu >= 0 && messages ? broker_cpu * 1e6 / messages : -1,
           100 * (s1.client_cpu - s0.client_cpu) / window, errors);
  } else {
    printf("---- streambench: %d producer(s), %d consumer(s), %d stream(s), %zu B, batch %d, confirm %d ----\n",
           O.producers, O.consumers, O.streams, O.size, O.batch, O.confirm);
    printf("window %.1f s: published %.0f/s  confirmed %.0f/s  consumed %.0f/s\n", window, rp, rc, rr);
    printf("totals: published %llu  confirmed %llu  consumed %llu  errors %d\n", (unsigned long long)total.published,
           (unsigned long long)total.confirmed, (unsigned long long)total.consumed, errors);
    if (lat->n)
      printf("latency ms  p50 %.3f  p95 %.3f  p99 %.3f  max %.3f\n", hist_pct_ms(lat, 0.5), hist_pct_ms(lat, 0.95),
             hist_pct_ms(lat, 0.99), lat->max / 1e6);
    if (clat->n)
      printf("confirm latency ms  p50 %.3f  p95 %.3f  p99 %.3f  max %.3f\n", hist_pct_ms(clat, 0.5),
             hist_pct_ms(clat, 0.95), hist_pct_ms(clat, 0.99), clat->max / 1e6);
    if (broker_cpu >= 0) printf("broker CPU %.1f %% of a core, %.3f us per message\n", 100 * broker_cpu / window,
                                messages ? broker_cpu * 1e6 / messages : -1);
  }
  return errors ? 1 : 0;
}
