/* Trace spans onto OTLP's protobuf wire: the compiled twin of router.gateway.tracing.otlp.span.
 *
 * One call writes a batch's spans (router.gateway.tracing.spans.Span) as the ``spans`` fields
 * of a ScopeSpans message, the bytes the pure-Python encoder writes, byte for byte (the
 * property tests hold the two together). A nested message's length precedes it on the wire,
 * so each is written after one reserved length byte, then moved along if its length needs more.
 * Anything the reference would meet that this does not expect (another attribute type, an id
 * or a time out of range) raises, and the caller encodes that batch with the reference.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#include "hotpath.h"

typedef struct {
    char *p;
    Py_ssize_t len, cap;
} Buf;

static int
grow(Buf *b, Py_ssize_t more)
{
    if (b->len + more <= b->cap)
        return 0;
    Py_ssize_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + more)
        cap *= 2;
    char *p = PyMem_Realloc(b->p, (size_t)cap);
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

static int
put(Buf *b, const void *data, Py_ssize_t n)
{
    if (grow(b, n) < 0)
        return -1;
    memcpy(b->p + b->len, data, (size_t)n);
    b->len += n;
    return 0;
}

static int
put_byte(Buf *b, unsigned char c)
{
    return put(b, &c, 1);
}

static int
put_varint(Buf *b, uint64_t v)
{
    unsigned char out[10];
    int n = 0;
    while (v > 0x7F) {
        out[n++] = (unsigned char)((v & 0x7F) | 0x80);
        v >>= 7;
    }
    out[n++] = (unsigned char)v;
    return put(b, out, n);
}

/* Little-endian, as protobuf's fixed64 and double are. */
static int
put_fixed64(Buf *b, uint64_t v)
{
    unsigned char out[8];
    for (int i = 0; i < 8; i++)
        out[i] = (unsigned char)(v >> (8 * i));
    return put(b, out, 8);
}

/* A nested message begins: its tag and one byte for its length; returns where that byte is. */
static Py_ssize_t
open_field(Buf *b, unsigned char tag)
{
    if (put_byte(b, tag) < 0 || put_byte(b, 0) < 0)
        return -1;
    return b->len - 1;
}

/* The message begun at ``at`` ends here: its length goes in, the body moved along if the
 * length takes more than the one byte reserved. */
static int
close_field(Buf *b, Py_ssize_t at)
{
    uint64_t n = (uint64_t)(b->len - at - 1);
    unsigned char out[10];
    int k = 0;
    uint64_t v = n;
    while (v > 0x7F) {
        out[k++] = (unsigned char)((v & 0x7F) | 0x80);
        v >>= 7;
    }
    out[k++] = (unsigned char)v;
    if (k > 1) {
        if (grow(b, k - 1) < 0)
            return -1;
        memmove(b->p + at + k, b->p + at + 1, (size_t)n);
        b->len += k - 1;
    }
    memcpy(b->p + at, out, (size_t)k);
    return 0;
}

static int
put_text(Buf *b, unsigned char tag, PyObject *s)
{
    Py_ssize_t n;
    const char *utf8 = PyUnicode_AsUTF8AndSize(s, &n);
    if (utf8 == NULL)
        return -1;
    if (put_byte(b, tag) < 0 || put_varint(b, (uint64_t)n) < 0)
        return -1;
    return put(b, utf8, n);
}

static PyObject *sixty_four; /* the shift to a trace id's high half */

/* An id of ``n`` bytes (8 or 16), big-endian as the wire has it; one out of range raises
 * OverflowError, as int.to_bytes does. */
static int
put_id(Buf *b, PyObject *id, int n)
{
    unsigned char out[16];
    uint64_t low, high = 0;
    if (n == 16) {
        PyObject *shifted = PyNumber_Rshift(id, sixty_four);
        if (shifted == NULL)
            return -1;
        high = PyLong_AsUnsignedLongLong(shifted);
        Py_DECREF(shifted);
        if (high == (uint64_t)-1 && PyErr_Occurred())
            return -1;
        low = PyLong_AsUnsignedLongLongMask(id);
    }
    else
        low = PyLong_AsUnsignedLongLong(id);
    if (low == (uint64_t)-1 && PyErr_Occurred())
        return -1;
    for (int i = 0; i < 8; i++) {
        if (n == 16)
            out[i] = (unsigned char)(high >> (56 - 8 * i));
        out[n - 8 + i] = (unsigned char)(low >> (56 - 8 * i));
    }
    return put(b, out, n);
}

static int put_any(Buf *b, PyObject *v);

static int
put_any_field(Buf *b, unsigned char tag, PyObject *v)
{
    Py_ssize_t at = open_field(b, tag);
    if (at < 0 || put_any(b, v) < 0)
        return -1;
    return close_field(b, at);
}

/* An AnyValue's body: the reference's order of checks (a bool is an int to Python). */
static int
put_any(Buf *b, PyObject *v)
{
    if (PyUnicode_Check(v))
        return put_text(b, 0x0a, v);
    if (PyBool_Check(v))
        return put_byte(b, 0x10) < 0 ? -1 : put_byte(b, v == Py_True ? 1 : 0);
    if (PyLong_Check(v)) {
        uint64_t x = PyLong_AsUnsignedLongLongMask(v); /* int64: two's complement */
        if (x == (uint64_t)-1 && PyErr_Occurred())
            return -1;
        return put_byte(b, 0x18) < 0 ? -1 : put_varint(b, x);
    }
    if (PyFloat_Check(v)) {
        double d = PyFloat_AS_DOUBLE(v);
        uint64_t bits;
        memcpy(&bits, &d, 8);
        return put_byte(b, 0x21) < 0 ? -1 : put_fixed64(b, bits);
    }
    if (PyList_Check(v) || PyTuple_Check(v)) {
        Py_ssize_t at = open_field(b, 0x2a);
        if (at < 0)
            return -1;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(v);
        PyObject **items = PySequence_Fast_ITEMS(v);
        for (Py_ssize_t i = 0; i < n; i++)
            if (put_any_field(b, 0x0a, items[i]) < 0)
                return -1;
        return close_field(b, at);
    }
    PyErr_Format(PyExc_TypeError, "an attribute of type %.100s", Py_TYPE(v)->tp_name);
    return -1;
}

/* The slots of a Span, looked up by name once. */
enum { TRACE, SPAN, STATE, PARENT, NAME, KIND, START, END, ATTRS, EVENTS, STATUS, MESSAGE, N };
static const char *const slot_names[N] = {
    "trace_id", "span_id", "trace_state", "parent_id", "name", "kind", "start", "end",
    "attributes", "events", "status", "message",
};
static PyObject *slot_keys[N];

static int
put_span(Buf *b, PyObject *span)
{
    PyObject *f[N] = {NULL};
    int rc = -1;
    for (int i = 0; i < N; i++)
        if ((f[i] = PyObject_GetAttr(span, slot_keys[i])) == NULL)
            goto done;
    Py_ssize_t at = open_field(b, 0x12);
    if (at < 0 || put(b, "\x0a\x10", 2) < 0 || put_id(b, f[TRACE], 16) < 0)
        goto done;
    if (put(b, "\x12\x08", 2) < 0 || put_id(b, f[SPAN], 8) < 0)
        goto done;
    int state = PyObject_IsTrue(f[STATE]);
    if (state < 0 || (state && put_text(b, 0x1a, f[STATE]) < 0))
        goto done;
    int parent = PyObject_IsTrue(f[PARENT]);
    if (parent < 0 || (parent && (put(b, "\x22\x08", 2) < 0 || put_id(b, f[PARENT], 8) < 0)))
        goto done;
    long kind = PyLong_AsLong(f[KIND]);
    if (put_text(b, 0x2a, f[NAME]) < 0 || (kind == -1 && PyErr_Occurred()))
        goto done;
    if (kind < 0 || kind > 3) {
        PyErr_SetString(PyExc_ValueError, "a span kind is 0 to 3");
        goto done;
    }
    if (put_byte(b, 0x30) < 0 || put_byte(b, (unsigned char)kind) < 0)
        goto done;
    uint64_t start = PyLong_AsUnsignedLongLong(f[START]);
    uint64_t end = PyLong_AsUnsignedLongLong(f[END]);
    if (PyErr_Occurred() || put_byte(b, 0x39) < 0 || put_fixed64(b, start) < 0)
        goto done;
    if (put_byte(b, 0x41) < 0 || put_fixed64(b, end) < 0)
        goto done;
    if (!PyDict_Check(f[ATTRS])) {
        PyErr_SetString(PyExc_TypeError, "a span's attributes are a dict");
        goto done;
    }
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    while (PyDict_Next(f[ATTRS], &pos, &k, &v)) {
        Py_ssize_t kv = open_field(b, 0x4a);
        if (kv < 0 || !PyUnicode_Check(k) || put_text(b, 0x0a, k) < 0) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "an attribute's key is a str");
            goto done;
        }
        if (put_any_field(b, 0x12, v) < 0 || close_field(b, kv) < 0)
            goto done;
    }
    PyObject *events = PySequence_Fast(f[EVENTS], "a span's events are a sequence");
    if (events == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(events); i++) {
        PyObject *e = PySequence_Fast_GET_ITEM(events, i);
        if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) != 2) {
            PyErr_SetString(PyExc_TypeError, "an event is (name, time)");
            Py_DECREF(events);
            goto done;
        }
        uint64_t t = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(e, 1));
        Py_ssize_t ev = open_field(b, 0x5a);
        if (PyErr_Occurred() || ev < 0 || put_byte(b, 0x09) < 0 || put_fixed64(b, t) < 0 ||
            put_text(b, 0x12, PyTuple_GET_ITEM(e, 0)) < 0 || close_field(b, ev) < 0) {
            Py_DECREF(events);
            goto done;
        }
    }
    Py_DECREF(events);
    long status = PyLong_AsLong(f[STATUS]);
    if (status == -1 && PyErr_Occurred())
        goto done;
    if (status) {
        if (status < 0 || status > 2) {
            PyErr_SetString(PyExc_ValueError, "a status code is 0 to 2");
            goto done;
        }
        Py_ssize_t st = open_field(b, 0x7a);
        int message = PyObject_IsTrue(f[MESSAGE]);
        if (st < 0 || message < 0 || (message && put_text(b, 0x12, f[MESSAGE]) < 0))
            goto done;
        if (put_byte(b, 0x18) < 0 || put_byte(b, (unsigned char)status) < 0 ||
            close_field(b, st) < 0)
            goto done;
    }
    rc = close_field(b, at);
done:
    for (int i = 0; i < N; i++)
        Py_XDECREF(f[i]);
    return rc;
}

/* otlp_spans(spans): the spans as a ScopeSpans message's ``spans`` fields, concatenated. */
PyObject *
hp_otlp_spans(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 1) {
        PyErr_SetString(PyExc_TypeError, "otlp_spans(spans)");
        return NULL;
    }
    if (sixty_four == NULL) {
        for (int i = 0; i < N; i++)
            if ((slot_keys[i] = PyUnicode_InternFromString(slot_names[i])) == NULL)
                return NULL;
        if ((sixty_four = PyLong_FromLong(64)) == NULL)
            return NULL;
    }
    PyObject *spans = PySequence_Fast(args[0], "otlp_spans takes a sequence of spans");
    if (spans == NULL)
        return NULL;
    Buf b = {NULL, 0, 0};
    PyObject *out = NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(spans);
    for (Py_ssize_t i = 0; i < n; i++)
        if (put_span(&b, PySequence_Fast_GET_ITEM(spans, i)) < 0)
            goto done;
    out = PyBytes_FromStringAndSize(b.p ? b.p : "", b.len);
done:
    PyMem_Free(b.p);
    Py_DECREF(spans);
    return out;
}
