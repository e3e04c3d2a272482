/* C twins of the per-message hot paths in framing.py and fastpath.py.
 *
 * scan:    framing._scan_python (the frames at the front of a connection's
 *          read buffer, a publish with its whole content as one item, its
 *          arguments decoded).
 * deliver: fastpath.deliver_python (a whole basic.deliver: method frame,
 *          content header, body frames, as one bytes object).
 * stream_chunks: amqp_server.stream.chunks.chunks_python (log records of a
 *          stream to the stream protocol's Deliver frames, in bulk).
 * publish_scan, publish_records: amqp_server.stream.batches (a Publish
 *          frame's messages to log records, in bulk).
 *
 * Each must give exactly what its Python twin gives for every input;
 * tests/test_framing.py, tests/test_fastpath.py and
 * tests/test_stream_chunks.py compare them. Neither
 * raises on malformed wire data: scan stops before anything it does not
 * like and framing.FrameReader reports it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>

#define FRAME_METHOD 1
#define FRAME_HEADER 2
#define FRAME_BODY 3
#define FRAME_HEARTBEAT 8
#define FRAME_END 0xCE
#define FRAME_OVERHEAD 8
#define CONTENT 0

static uint16_t get16(const unsigned char *p) { return (uint16_t)((p[0] << 8) | p[1]); }

static uint32_t get32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

static uint64_t get64(const unsigned char *p) { return ((uint64_t)get32(p) << 32) | get32(p + 4); }

static unsigned char *put16(unsigned char *p, unsigned v)
{
    p[0] = (unsigned char)(v >> 8);
    p[1] = (unsigned char)v;
    return p + 2;
}

static unsigned char *put32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
    return p + 4;
}

static unsigned char *put64(unsigned char *p, uint64_t v)
{
    put32(p, (uint32_t)(v >> 32));
    return put32(p + 4, (uint32_t)v);
}

/* A complete, well-ended frame of an allowed size at `pos`: its type,
 * channel, payload size; 0 when not (incomplete, bad end, too large). */
static int frame_at(const unsigned char *buf, Py_ssize_t pos, Py_ssize_t limit, uint64_t frame_max,
                    int *type, unsigned *channel, uint32_t *size)
{
    if (limit - pos < 7)
        return 0;
    *type = buf[pos];
    *channel = get16(buf + pos + 1);
    *size = get32(buf + pos + 3);
    if (frame_max && (uint64_t)*size + FRAME_OVERHEAD > frame_max)
        return 0;
    Py_ssize_t end = pos + 7 + (Py_ssize_t)*size;
    if (end >= limit || buf[end] != FRAME_END)
        return 0;
    return 1;
}

static PyObject *slice(const unsigned char *buf, Py_ssize_t start, Py_ssize_t size)
{
    return PyBytes_FromStringAndSize((const char *)buf + start, size);
}

/* framing._publish_arguments: (exchange, routing_key, mandatory, method)
 * of a basic.publish payload of `size` bytes at `p`, or NULL with no error
 * set when it is not the plain case (malformed, trailing bytes, names not
 * UTF-8, immediate); NULL with an error set only when out of memory. */
static PyObject *publish_arguments(const unsigned char *p, uint32_t size)
{
    if (size < 7)
        return NULL;
    Py_ssize_t xlen = p[6];
    if (7 + xlen >= (Py_ssize_t)size)
        return NULL;
    Py_ssize_t klen = p[7 + xlen];
    if (8 + xlen + klen >= (Py_ssize_t)size || (Py_ssize_t)size != 9 + xlen + klen)
        return NULL;
    unsigned bits = p[8 + xlen + klen];
    if (bits & 2)
        return NULL;
    PyObject *exchange = PyUnicode_DecodeUTF8((const char *)p + 7, xlen, NULL);
    if (exchange == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
            return NULL;
        PyErr_Clear();
        return NULL;
    }
    PyObject *key = PyUnicode_DecodeUTF8((const char *)p + 8 + xlen, klen, NULL);
    if (key == NULL) {
        Py_DECREF(exchange);
        if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
            PyErr_Clear();
        return NULL;
    }
    PyObject *method = PyBytes_FromStringAndSize((const char *)p, size);
    if (method == NULL) {
        Py_DECREF(exchange);
        Py_DECREF(key);
        return NULL;
    }
    return Py_BuildValue("(NNON)", exchange, key, (bits & 1) ? Py_True : Py_False, method);
}

static PyObject *scan(PyObject *Py_UNUSED(module), PyObject *args)
{
    Py_buffer view;
    unsigned long long frame_max;
    long long budget;
    if (!PyArg_ParseTuple(args, "y*KL", &view, &frame_max, &budget))
        return NULL;
    const unsigned char *buf = view.buf;
    Py_ssize_t limit = view.len, pos = 0;
    PyObject *items = PyList_New(0);
    if (items == NULL)
        goto fail;
    while (budget > 0) {
        int type;
        unsigned channel;
        uint32_t size;
        if (!frame_at(buf, pos, limit, frame_max, &type, &channel, &size))
            break;
        if (type != FRAME_METHOD && type != FRAME_HEADER && type != FRAME_BODY && type != FRAME_HEARTBEAT)
            break;
        Py_ssize_t start = pos + 7;
        pos = start + size + 1;
        budget -= size;
        PyObject *item = NULL;
        if (type == FRAME_METHOD && channel && size >= 4 && get32(buf + start) == 0x003C0028) {
            /* A basic content header, then (unless the body is empty) one
             * body frame holding the whole body, both on this channel. */
            int htype, btype;
            unsigned hchannel, bchannel;
            uint32_t hsize, bsize;
            if (frame_at(buf, pos, limit, frame_max, &htype, &hchannel, &hsize) && htype == FRAME_HEADER
                && hchannel == channel && hsize >= 14 && get16(buf + pos + 7) == 60) {
                Py_ssize_t hstart = pos + 7;
                uint64_t body_size = get64(buf + hstart + 4);
                Py_ssize_t after = hstart + hsize + 1;
                int whole = body_size == 0;
                if (!whole && frame_at(buf, after, limit, frame_max, &btype, &bchannel, &bsize)
                    && btype == FRAME_BODY && bchannel == channel && bsize == body_size)
                    whole = 1;
                PyObject *publish = whole ? publish_arguments(buf + start, size) : NULL;
                if (publish == NULL && PyErr_Occurred())
                    goto fail;
                if (publish != NULL) {
                    PyObject *header = slice(buf, hstart, hsize);
                    PyObject *body = body_size ? slice(buf, after + 7, bsize) : PyBytes_FromStringAndSize("", 0);
                    if (body_size)
                        after += 7 + bsize + 1;
                    if (header && body)
                        item = Py_BuildValue("(iiNNNn)", CONTENT, (int)channel, publish, header, body, after);
                    else {
                        Py_DECREF(publish);
                        Py_XDECREF(header);
                        Py_XDECREF(body);
                    }
                    if (item == NULL)
                        goto fail;
                    budget -= hsize + (long long)body_size;
                    pos = after;
                }
            }
        }
        if (item == NULL) {
            PyObject *payload = slice(buf, start, size);
            if (payload == NULL)
                goto fail;
            item = Py_BuildValue("(iiNOOn)", type, (int)channel, payload, Py_None, Py_None, pos);
            if (item == NULL)
                goto fail;
        }
        if (PyList_Append(items, item) < 0) {
            Py_DECREF(item);
            goto fail;
        }
        Py_DECREF(item);
    }
    PyBuffer_Release(&view);
    return items;
fail:
    Py_XDECREF(items);
    PyBuffer_Release(&view);
    return NULL;
}

/* The UTF-8 of a str argument, which CPython keeps with the str (no copy for ASCII). */
static int utf8_arg(PyObject *arg, const char **s, Py_ssize_t *len)
{
    if (!PyUnicode_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "deliver: a str is required, not %.100s", Py_TYPE(arg)->tp_name);
        return -1;
    }
    *s = PyUnicode_AsUTF8AndSize(arg, len);
    return *s == NULL ? -1 : 0;
}

/* Called once per delivery: the arguments are read one by one (METH_FASTCALL) rather than through
 * PyArg_ParseTuple's format string, which cost a twentieth of a fanout delivery. */
static PyObject *deliver(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    const char *ctag, *exchange, *routing_key;
    Py_ssize_t ctag_len, exchange_len, routing_key_len;
    Py_buffer header = {0}, body = {0};
    if (nargs != 9) {
        PyErr_Format(PyExc_TypeError, "deliver takes 9 arguments (%zd given)", nargs);
        return NULL;
    }
    unsigned long channel = PyLong_AsUnsignedLong(args[0]);
    if (channel == (unsigned long)-1 && PyErr_Occurred())
        return NULL;
    unsigned long long delivery_tag = PyLong_AsUnsignedLongLong(args[2]);
    if (delivery_tag == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    int redelivered = PyObject_IsTrue(args[3]);
    unsigned long long frame_max = PyLong_AsUnsignedLongLong(args[8]);
    if (redelivered < 0 || (frame_max == (unsigned long long)-1 && PyErr_Occurred()))
        return NULL;
    if (utf8_arg(args[1], &ctag, &ctag_len) < 0 || utf8_arg(args[4], &exchange, &exchange_len) < 0
        || utf8_arg(args[5], &routing_key, &routing_key_len) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[6], &header, PyBUF_SIMPLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[7], &body, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&header);
        return NULL;
    }
    PyObject *out = NULL;
    if (channel > 0xFFFF || ctag_len > 255 || exchange_len > 255 || routing_key_len > 255 || frame_max <= FRAME_OVERHEAD
        || header.len > 0xFFFFFFFFLL) {
        PyErr_SetString(PyExc_ValueError, "deliver: argument out of range");
        goto done;
    }
    Py_ssize_t chunk = (Py_ssize_t)(frame_max - FRAME_OVERHEAD < PY_SSIZE_T_MAX ? frame_max - FRAME_OVERHEAD
                                                                                : PY_SSIZE_T_MAX);
    Py_ssize_t method_size = 4 + 1 + ctag_len + 9 + 1 + exchange_len + 1 + routing_key_len;
    Py_ssize_t body_frames = body.len / chunk + (body.len % chunk != 0);
    Py_ssize_t total = 7 + method_size + 1 + 7 + header.len + 1 + body_frames * FRAME_OVERHEAD + body.len;
    out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL)
        goto done;
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(out);
    *p++ = FRAME_METHOD;
    p = put16(p, channel);
    p = put32(p, (uint32_t)method_size);
    p = put32(p, 0x003C003C);
    *p++ = (unsigned char)ctag_len;
    memcpy(p, ctag, ctag_len);
    p += ctag_len;
    p = put64(p, delivery_tag);
    *p++ = redelivered ? 1 : 0;
    *p++ = (unsigned char)exchange_len;
    memcpy(p, exchange, exchange_len);
    p += exchange_len;
    *p++ = (unsigned char)routing_key_len;
    memcpy(p, routing_key, routing_key_len);
    p += routing_key_len;
    *p++ = FRAME_END;
    *p++ = FRAME_HEADER;
    p = put16(p, channel);
    p = put32(p, (uint32_t)header.len);
    memcpy(p, header.buf, header.len);
    p += header.len;
    *p++ = FRAME_END;
    for (Py_ssize_t at = 0; at < body.len; at += chunk) {
        Py_ssize_t part = body.len - at < chunk ? body.len - at : chunk;
        *p++ = FRAME_BODY;
        p = put16(p, channel);
        p = put32(p, (uint32_t)part);
        memcpy(p, (const char *)body.buf + at, part);
        p += part;
        *p++ = FRAME_END;
    }
done:
    PyBuffer_Release(&header);
    PyBuffer_Release(&body);
    return out;
}

/* ---- stream_chunks ------------------------------------------------------ */

/* CRC-32 (zlib's: reflected, polynomial 0xEDB88320). The extension links
 * no zlib (it builds with a bare compiler line, and without zlib's headers),
 * so it takes zlib's crc32 from the zlib shared library at run time when it
 * is there (libz.so.1, about twice as fast as the tables on long records),
 * and otherwise computes it by slicing by 8 (a byte at a time would cost
 * more than the rest of the consume path). Same results either way. */
typedef unsigned long (*zlib_crc32_t)(unsigned long, const unsigned char *, unsigned int);
static zlib_crc32_t zlib_crc32;
static uint32_t crc_table[8][256];

static void crc_init(void)
{
    void *zlib = dlopen("libz.so.1", RTLD_NOW | RTLD_LOCAL);
    if (zlib != NULL)
        zlib_crc32 = (zlib_crc32_t)dlsym(zlib, "crc32"); /* the library stays loaded, as the module */
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++)
        for (int t = 1; t < 8; t++)
            crc_table[t][n] = (crc_table[t - 1][n] >> 8) ^ crc_table[0][crc_table[t - 1][n] & 0xFF];
}

static uint32_t crc32_of(uint32_t crc, const unsigned char *p, Py_ssize_t n)
{
    if (zlib_crc32 != NULL && n >= 64 && n <= UINT_MAX)
        return (uint32_t)zlib_crc32(crc, p, (unsigned int)n);
    crc = ~crc;
    while (n >= 8) {
        uint32_t a = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        uint32_t b = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 | (uint32_t)p[7] << 24;
        crc = crc_table[7][a & 0xFF] ^ crc_table[6][(a >> 8) & 0xFF] ^ crc_table[5][(a >> 16) & 0xFF]
              ^ crc_table[4][a >> 24] ^ crc_table[3][b & 0xFF] ^ crc_table[2][(b >> 8) & 0xFF]
              ^ crc_table[1][(b >> 16) & 0xFF] ^ crc_table[0][b >> 24];
        p += 8;
        n -= 8;
    }
    while (n--)
        crc = crc_table[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

#define STOP_END 0
#define STOP_LIMIT 1
#define STOP_CREDIT 2
#define STOP_OTHER 3
#define STOP_DAMAGED 4
#define MAX_ENTRIES 0xFFFF
#define RECORD_MIN 25 /* length, offset, timestamp, CRC, end marker */
#define CHUNK_HEAD 48 /* osiris's chunk header */

typedef struct {
    Py_ssize_t at, len; /* a message's bytes in the input */
} entry_t;

/* One Deliver frame of `count` messages (chunks.deliver_frame). */
static PyObject *chunk_frame(const unsigned char *buf, const entry_t *entries, Py_ssize_t count,
                             Py_ssize_t data_len, unsigned subscription_id, long long committed,
                             uint64_t first, uint64_t stamp)
{
    Py_ssize_t head = 4 + 2 + 2 + 1 + (committed >= 0 ? 8 : 0);
    PyObject *out = PyBytes_FromStringAndSize(NULL, head + CHUNK_HEAD + data_len);
    if (out == NULL)
        return NULL;
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(out), *data = p + head + CHUNK_HEAD, *q = data;
    uint32_t crc;
    /* Copying and checksumming touch only the new object and the caller's buffer: other
     * threads (the event loop, while this runs on the reader thread) run meanwhile. */
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < count; i++) {
        q = put32(q, (uint32_t)entries[i].len);
        memcpy(q, buf + entries[i].at, entries[i].len);
        q += entries[i].len;
    }
    crc = crc32_of(0, data, data_len);
    Py_END_ALLOW_THREADS
    p = put32(p, (uint32_t)(head - 4 + CHUNK_HEAD + data_len));
    p = put16(p, 8); /* Deliver */
    p = put16(p, committed >= 0 ? 2 : 1);
    *p++ = (unsigned char)subscription_id;
    if (committed >= 0)
        p = put64(p, (uint64_t)committed);
    *p++ = 0x51; /* osiris magic 5, chunk format 1 */
    *p++ = 0;    /* a user chunk */
    p = put16(p, (unsigned)count);
    p = put32(p, (uint32_t)count);
    p = put64(p, stamp);
    p = put64(p, 1); /* epoch */
    p = put64(p, first);
    p = put32(p, crc);
    p = put32(p, (uint32_t)data_len);
    memset(p, 0, 8); /* trailer length, filter size, reserved */
    return out;
}

static PyObject *stream_chunks(PyObject *Py_UNUSED(module), PyObject *args)
{
    Py_buffer view;
    unsigned long long start, limit, max_bytes, max_chunks;
    unsigned subscription_id;
    long long committed;
    if (!PyArg_ParseTuple(args, "y*KKILKK", &view, &start, &limit, &subscription_id, &committed, &max_bytes,
                          &max_chunks))
        return NULL;
    const unsigned char *buf = view.buf;
    Py_ssize_t size = view.len, pos = 0, count = 0, capacity = 1024, data_len = 0;
    uint64_t following = start, previous = 0, first = 0, stamp = 0;
    int stop = STOP_END;
    entry_t *entries = PyMem_Malloc(capacity * sizeof(entry_t));
    PyObject *frames = PyList_New(0);
    if (entries == NULL || frames == NULL)
        goto fail;
    /* The records' checks first, without the GIL (they read only the caller's buffer): the
     * whole records before `checked` check out; the one at `checked`, if any, does not. */
    Py_ssize_t checked = 0;
    Py_BEGIN_ALLOW_THREADS
    while (checked + RECORD_MIN <= size) {
        uint32_t length = get32(buf + checked);
        Py_ssize_t end = checked + 9 + (Py_ssize_t)length;
        if (end > size || length < 16 || buf[end - 1] != 0xFF
            || crc32_of(0, buf + checked + 4, length) != get32(buf + end - 5))
            break;
        checked = end;
    }
    Py_END_ALLOW_THREADS
    while (pos + RECORD_MIN <= size) {
        uint32_t length = get32(buf + pos);
        uint64_t offset = get64(buf + pos + 4);
        Py_ssize_t end = pos + 9 + (Py_ssize_t)length;
        if (end > size)
            break;
        if (pos >= checked) { /* checked above: a whole record there does not check out */
            stop = STOP_DAMAGED;
            break;
        }
        if (offset < start) {
            pos = end;
            continue;
        }
        if (offset >= limit) {
            stop = STOP_LIMIT;
            break;
        }
        Py_ssize_t payload = pos + 20, body_end = pos + 4 + (Py_ssize_t)length;
        Py_ssize_t at = body_end - payload >= 5 ? payload + 5 + get16(buf + payload + 3) : body_end;
        if (buf[payload] != 0xFF || buf[payload + 1] != 0xFF || at >= body_end) {
            stop = STOP_OTHER;
            break;
        }
        at += 1 + buf[at] + (buf[at] ? 8 : 0);
        if (at > body_end) {
            stop = STOP_OTHER;
            break;
        }
        Py_ssize_t message = body_end - at;
        if (count && (offset != previous + 1 || (unsigned long long)(data_len + 4 + message) > max_bytes
                      || count == MAX_ENTRIES)) {
            PyObject *frame = chunk_frame(buf, entries, count, data_len, subscription_id, committed, first, stamp);
            PyObject *item = frame ? Py_BuildValue("(NKn)", frame, (unsigned long long)first, count) : NULL;
            if (item == NULL || PyList_Append(frames, item) < 0) {
                Py_XDECREF(item);
                goto fail;
            }
            Py_DECREF(item);
            count = data_len = 0;
        }
        if (!count) {
            if ((unsigned long long)PyList_GET_SIZE(frames) == max_chunks) {
                stop = STOP_CREDIT;
                break;
            }
            first = offset;
            stamp = get64(buf + pos + 12);
        }
        if (count == capacity) {
            capacity *= 2;
            entry_t *more = PyMem_Realloc(entries, capacity * sizeof(entry_t));
            if (more == NULL) {
                PyErr_NoMemory();
                goto fail;
            }
            entries = more;
        }
        entries[count].at = at;
        entries[count].len = message;
        count++;
        data_len += 4 + message;
        previous = offset;
        following = offset + 1;
        pos = end;
    }
    if (count) {
        PyObject *frame = chunk_frame(buf, entries, count, data_len, subscription_id, committed, first, stamp);
        PyObject *item = frame ? Py_BuildValue("(NKn)", frame, (unsigned long long)first, count) : NULL;
        if (item == NULL || PyList_Append(frames, item) < 0) {
            Py_XDECREF(item);
            goto fail;
        }
        Py_DECREF(item);
    }
    PyMem_Free(entries);
    PyBuffer_Release(&view);
    return Py_BuildValue("(NKi)", frames, (unsigned long long)following, stop);
fail:
    PyMem_Free(entries);
    Py_XDECREF(frames);
    PyBuffer_Release(&view);
    return NULL;
}

/* ---- publish_scan, publish_records --------------------------------------- */

/* stream.batches.scan_python: (message bytes, packed publishing ids) of
 * `count` plain entries ending exactly at the end of the frame, or None. */
static PyObject *publish_scan(PyObject *Py_UNUSED(module), PyObject *args)
{
    Py_buffer view;
    Py_ssize_t pos, count;
    if (!PyArg_ParseTuple(args, "y*nn", &view, &pos, &count))
        return NULL;
    const unsigned char *buf = view.buf;
    Py_ssize_t size = view.len, at = pos;
    unsigned long long total = 0;
    PyObject *out = NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (at < 0 || at + 12 > size || buf[at + 8] & 0x80)
            goto none;
        uint32_t length = get32(buf + at + 8);
        if ((unsigned long long)at + 12 + length > (unsigned long long)size)
            goto none;
        total += length;
        at += 12 + (Py_ssize_t)length;
    }
    if (at != size || count < 0)
        goto none;
    PyObject *ids = PyBytes_FromStringAndSize(NULL, count * 8);
    if (ids == NULL)
        goto done;
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(ids);
    for (Py_ssize_t i = 0, q = pos; i < count; i++) {
        memcpy(p + 8 * i, buf + q, 8);
        q += 12 + (Py_ssize_t)get32(buf + q + 8);
    }
    out = Py_BuildValue("(KN)", total, ids);
    goto done;
none:
    Py_INCREF(Py_None);
    out = Py_None;
done:
    PyBuffer_Release(&view);
    return out;
}

/* stream.batches.records_python: the log records of entries publish_scan
 * accepted, the index entries due among them, the bytes after the last. */
static PyObject *publish_records(PyObject *Py_UNUSED(module), PyObject *args)
{
    Py_buffer view, prefix;
    Py_ssize_t pos, count;
    unsigned long long first, timestamp, since_index, interval;
    if (!PyArg_ParseTuple(args, "y*nny*KKKK", &view, &pos, &count, &prefix, &first, &timestamp, &since_index,
                          &interval))
        return NULL;
    const unsigned char *buf = view.buf;
    PyObject *out = NULL, *entries = NULL, *data = NULL;
    Py_ssize_t total = 0, at = pos;
    for (Py_ssize_t i = 0; i < count; i++) { /* publish_scan checked these bounds */
        uint32_t length = get32(buf + at + 8);
        total += 25 + prefix.len + (Py_ssize_t)length;
        at += 12 + (Py_ssize_t)length;
    }
    if (at > view.len) {
        PyErr_SetString(PyExc_ValueError, "publish_records: entries beyond the frame");
        goto done;
    }
    entries = PyList_New(0);
    data = PyBytes_FromStringAndSize(NULL, total);
    Py_ssize_t *due = PyMem_Malloc((count ? count : 1) * 2 * sizeof(Py_ssize_t)); /* (index, position) */
    if (entries == NULL || data == NULL || due == NULL) {
        PyMem_Free(due);
        goto done;
    }
    Py_ssize_t ndue = 0;
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(data), *start = p;
    at = pos;
    /* Framing and checksumming touch only the new object and the caller's buffers: other
     * threads (the reader thread building deliveries) run meanwhile. */
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < count; i++) {
        uint32_t length = get32(buf + at + 8);
        uint32_t body = 16 + (uint32_t)prefix.len + length;
        if (since_index >= interval) {
            due[2 * ndue] = i;
            due[2 * ndue + 1] = p - start;
            ndue++;
            since_index = 0;
        }
        since_index += 9 + body;
        p = put32(p, body);
        unsigned char *b = p;
        p = put64(p, first + (unsigned long long)i);
        p = put64(p, timestamp);
        memcpy(p, prefix.buf, prefix.len);
        p += prefix.len;
        memcpy(p, buf + at + 12, length);
        p += length;
        p = put32(p, crc32_of(0, b, body));
        *p++ = 0xFF; /* storage.record.END_MARKER */
        at += 12 + (Py_ssize_t)length;
    }
    Py_END_ALLOW_THREADS
    for (Py_ssize_t k = 0; k < ndue; k++) {
        PyObject *entry = Py_BuildValue("(Kn)", first + (unsigned long long)due[2 * k], due[2 * k + 1]);
        if (entry == NULL || PyList_Append(entries, entry) < 0) {
            Py_XDECREF(entry);
            PyMem_Free(due);
            goto done;
        }
        Py_DECREF(entry);
    }
    PyMem_Free(due);
    out = Py_BuildValue("(OOK)", data, entries, since_index);
done:
    Py_XDECREF(data);
    Py_XDECREF(entries);
    PyBuffer_Release(&view);
    PyBuffer_Release(&prefix);
    return out;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS, "framing._scan_python in C."},
    {"deliver", (PyCFunction)(void (*)(void))deliver, METH_FASTCALL, "fastpath.deliver_python in C."},
    {"stream_chunks", stream_chunks, METH_VARARGS, "stream.chunks.chunks_python in C."},
    {"publish_scan", publish_scan, METH_VARARGS, "stream.batches.scan_python in C."},
    {"publish_records", publish_records, METH_VARARGS, "stream.batches.records_python in C."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, .m_name = "_framing", .m_size = -1, .m_methods = methods};

/* The layout of what scan and deliver take and give; framing.C_VERSION must
 * match, so a stale build (an older layout) is ignored, not misread. */
#define VERSION 3

PyMODINIT_FUNC PyInit__framing(void)
{
    crc_init();
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "VERSION", VERSION) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
