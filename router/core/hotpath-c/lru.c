/* Lru: the compiled LruKeys (router/core/lru.py), a bounded recency-ordered set of 64-bit
 * block keys, each with the time it was last touched.
 *
 * The reference keeps keys in a dict, whose insertion order is the recency order: a touch
 * pops the key and inserts it again. Each of those probes compares the caller's int object
 * with the one stored, a cache miss on an object the dict's table only points to. Here the
 * keys are plain uint64 values in the table itself:
 *
 * - ``slots``: an open-addressing table (linear probing, deletion by backward shift, so no
 *   tombstones) from key to its position in the log;
 * - ``log``: every touch appended in order, key and time. An entry is live while its key's
 *   slot points at it; a later touch of the key leaves it stale, and stale entries are skipped
 *   by the scans from the oldest end (eviction, expiry, iteration) and dropped when the log
 *   is compacted.
 *
 * A touch is then one probe and one append, and an entry costs about 50 bytes, against the
 * dict's 74. The order of keys, the times, the evictions (in the reference's batches) and the
 * walks' probe sequences are the reference's exactly; tests/core/test_hotpath.py holds them
 * to it. Keys outside 0..2**64-1 cannot be stored (OverflowError); asked about, they are not
 * held. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "hotpath.h"

/* router/core/lru.py's EVICT_BATCH_DIVISOR: a full set evicts capacity / 64 keys more. */
#define EVICT_BATCH_DIVISOR 64
#define MIN_SLOTS 8
#define MIN_LOG 8

typedef struct {
    uint64_t key;
    Py_ssize_t pos; /* the key's entry in the log; < 0: the slot is empty */
} slot;

typedef struct {
    uint64_t key;
    double t;
} touch_mark;

typedef struct {
    PyObject_HEAD
    slot *slots;
    size_t mask; /* slots - 1, a power of two less one */
    touch_mark *log;
    Py_ssize_t lo, hi, room; /* live entries lie in [lo, hi); room: the log's length */
    Py_ssize_t n;            /* keys held */
    Py_ssize_t capacity;
    PyObject *ttl; /* None or a number, as given */
} Lru;

static inline size_t
spot(uint64_t k, size_t mask)
{
    /* Keys are hashes already, but a peer's or a test's need not be: mix them anyway. */
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return (size_t)k & mask;
}

/* The slot holding ``k``, or -1. */
static inline Py_ssize_t
find(const Lru *s, uint64_t k)
{
    size_t i = spot(k, s->mask);
    for (;;) {
        const slot *e = &s->slots[i];
        if (e->pos < 0)
            return -1;
        if (e->key == k)
            return (Py_ssize_t)i;
        i = (i + 1) & s->mask;
    }
}

static inline int
live(const Lru *s, Py_ssize_t at, Py_ssize_t *where)
{
    Py_ssize_t i = find(s, s->log[at].key);
    if (where != NULL)
        *where = i;
    return i >= 0 && s->slots[i].pos == at;
}

static void
remove_slot(Lru *s, size_t i)
{
    size_t j = i, mask = s->mask;
    for (;;) {
        j = (j + 1) & mask;
        if (s->slots[j].pos < 0)
            break;
        /* The entry at j may move back to i unless its home lies after i (up to j). */
        size_t home = spot(s->slots[j].key, mask);
        if (((j - home) & mask) >= ((j - i) & mask)) {
            s->slots[i] = s->slots[j];
            i = j;
        }
    }
    s->slots[i].pos = -1;
    s->n--;
}

static slot *
empty_slots(size_t count)
{
    slot *t = PyMem_Malloc(sizeof(slot) * count);
    if (t == NULL)
        return NULL;
    memset(t, 0xff, sizeof(slot) * count); /* every pos -1 */
    return t;
}

/* Room in the table for ``extra`` more keys, at most 70% full. */
static int
reserve_slots(Lru *s, Py_ssize_t extra)
{
    size_t want = s->mask + 1;
    while ((size_t)(s->n + extra) * 10 > want * 7)
        want *= 2;
    if (want == s->mask + 1)
        return 0;
    slot *t = empty_slots(want);
    if (t == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    size_t mask = want - 1;
    for (size_t i = 0; i <= s->mask; i++) {
        if (s->slots[i].pos < 0)
            continue;
        size_t j = spot(s->slots[i].key, mask);
        while (t[j].pos >= 0)
            j = (j + 1) & mask;
        t[j] = s->slots[i];
    }
    PyMem_Free(s->slots);
    s->slots = t;
    s->mask = mask;
    return 0;
}

/* Room at the log's end for ``extra`` more touches: stale entries dropped when they are at
 * least half of it, else a longer log. */
static int
reserve_log(Lru *s, Py_ssize_t extra)
{
    if (s->room - s->hi >= extra)
        return 0;
    if (s->n <= s->hi / 2 && s->room - s->n >= extra) {
        Py_ssize_t w = 0;
        for (Py_ssize_t r = s->lo; r < s->hi; r++) {
            Py_ssize_t i;
            if (live(s, r, &i)) {
                s->log[w] = s->log[r];
                s->slots[i].pos = w++;
            }
        }
        s->lo = 0;
        s->hi = w;
        return 0;
    }
    Py_ssize_t want = s->room;
    while (want - s->hi < extra)
        want *= 2;
    touch_mark *log = PyMem_Realloc(s->log, sizeof(touch_mark) * (size_t)want);
    if (log == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    s->log = log;
    s->room = want;
    return 0;
}

/* ``keys`` (a sequence) as uint64 values in a new buffer; NULL on an error (raised). */
static uint64_t *
key_values(PyObject *keys, Py_ssize_t *count)
{
    PyObject *seq = PySequence_Fast(keys, "keys must be a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    uint64_t *out = PyMem_Malloc(sizeof(uint64_t) * (size_t)(n ? n : 1));
    if (out == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        out[i] = PyLong_AsUnsignedLongLong(items[i]);
        if (out[i] == (uint64_t)-1 && PyErr_Occurred()) {
            PyMem_Free(out);
            Py_DECREF(seq);
            return NULL;
        }
    }
    Py_DECREF(seq);
    *count = n;
    return out;
}

/* ``key`` as a uint64: 1, or 0 when it is no such value (so it cannot be held). */
static int
key_value(PyObject *key, uint64_t *out)
{
    if (!PyLong_Check(key))
        return 0;
    *out = PyLong_AsUnsignedLongLong(key);
    if (*out == (uint64_t)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

static void
reset(Lru *s)
{
    memset(s->slots, 0xff, sizeof(slot) * (s->mask + 1));
    s->n = s->lo = s->hi = 0;
}

/* -- creation ---------------------------------------------------------------------------- */

static PyObject *
lru_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"capacity", "ttl", NULL};
    Py_ssize_t capacity;
    PyObject *ttl = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "n|O:Lru", names, &capacity, &ttl))
        return NULL;
    if (capacity < 1)
        return PyErr_Format(PyExc_ValueError, "capacity must be at least 1, got %zd", capacity);
    Lru *s = (Lru *)type->tp_alloc(type, 0);
    if (s == NULL)
        return NULL;
    s->slots = empty_slots(MIN_SLOTS);
    s->log = PyMem_Malloc(sizeof(touch_mark) * MIN_LOG);
    s->ttl = Py_NewRef(ttl);
    if (s->slots == NULL || s->log == NULL) {
        Py_DECREF(s);
        return PyErr_NoMemory();
    }
    s->mask = MIN_SLOTS - 1;
    s->room = MIN_LOG;
    s->capacity = capacity;
    return (PyObject *)s;
}

static void
lru_dealloc(Lru *s)
{
    PyMem_Free(s->slots);
    PyMem_Free(s->log);
    Py_XDECREF(s->ttl);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

/* -- scans from the oldest end ---------------------------------------------------------- */

/* Remove and return up to ``count`` of the least recently touched keys; with ``timed``, only
 * those touched at or before ``horizon`` (the oldest first, stopping at a newer one). */
static PyObject *
pop_oldest(Lru *s, Py_ssize_t count, int timed, double horizon)
{
    PyObject *out = PyList_New(0);
    while (out != NULL && count > 0 && s->lo < s->hi) {
        Py_ssize_t i;
        if (live(s, s->lo, &i)) {
            if (timed && s->log[s->lo].t > horizon)
                break;
            PyObject *k = PyLong_FromUnsignedLongLong(s->log[s->lo].key);
            if (k == NULL || PyList_Append(out, k) < 0) {
                Py_XDECREF(k);
                Py_CLEAR(out);
                break;
            }
            Py_DECREF(k);
            remove_slot(s, (size_t)i);
            count--;
        }
        s->lo++;
    }
    if (s->n == 0)
        s->lo = s->hi = 0;
    return out;
}

static PyObject *
lru_evict(Lru *s, PyObject *arg)
{
    Py_ssize_t count = PyNumber_AsSsize_t(arg, PyExc_OverflowError);
    if (count == -1 && PyErr_Occurred())
        return NULL;
    if (count < 0) /* as islice says */
        return PyErr_Format(PyExc_ValueError, "count must be at least 0, got %zd", count);
    return pop_oldest(s, count, 0, 0.0);
}

static PyObject *
lru_expire(Lru *s, PyObject *now)
{
    if (s->ttl == Py_None)
        return PyList_New(0);
    PyObject *h = PyNumber_Subtract(now, s->ttl);
    if (h == NULL)
        return NULL;
    double horizon = PyFloat_AsDouble(h);
    Py_DECREF(h);
    if (horizon == -1.0 && PyErr_Occurred())
        return NULL;
    return pop_oldest(s, PY_SSIZE_T_MAX, 1, horizon);
}

/* The keys oldest first, or with ``times`` (key, time) pairs. */
static PyObject *
in_order(Lru *s, int times)
{
    PyObject *out = PyList_New(s->n);
    if (out == NULL)
        return NULL;
    Py_ssize_t w = 0;
    for (Py_ssize_t r = s->lo; r < s->hi && w < s->n; r++) {
        if (!live(s, r, NULL))
            continue;
        PyObject *v = times ? Py_BuildValue("(Kd)", (unsigned long long)s->log[r].key,
                                            s->log[r].t)
                            : PyLong_FromUnsignedLongLong(s->log[r].key);
        if (v == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, w++, v);
    }
    return out;
}

static PyObject *
lru_iter(Lru *s)
{
    PyObject *keys = in_order(s, 0);
    if (keys == NULL)
        return NULL;
    PyObject *it = PyObject_GetIter(keys);
    Py_DECREF(keys);
    return it;
}

static PyObject *
lru_items(Lru *s, PyObject *unused)
{
    return in_order(s, 1);
}

static PyObject *
lru_evicted_age(Lru *s, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "evicted_age(count, now)");
        return NULL;
    }
    Py_ssize_t count = PyNumber_AsSsize_t(args[0], PyExc_OverflowError);
    if (count == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t over = s->n + count - s->capacity;
    if (over <= 0 || s->n == 0)
        Py_RETURN_NONE;
    Py_ssize_t nth = over < s->n ? over : s->n; /* the nth oldest key's time */
    for (Py_ssize_t r = s->lo; r < s->hi; r++) {
        if (live(s, r, NULL) && --nth == 0) {
            PyObject *t = PyFloat_FromDouble(s->log[r].t);
            if (t == NULL)
                return NULL;
            PyObject *age = PyNumber_Subtract(args[1], t);
            Py_DECREF(t);
            return age;
        }
    }
    PyErr_SetString(PyExc_SystemError, "Lru: fewer live keys than counted");
    return NULL;
}

/* -- changes ----------------------------------------------------------------------------- */

static PyObject *
touch(Lru *s, PyObject *keys, PyObject *now_obj, int reverse)
{
    double now = PyFloat_AsDouble(now_obj);
    if (now == -1.0 && PyErr_Occurred())
        return NULL;
    Py_ssize_t n;
    uint64_t *ks = key_values(keys, &n);
    if (ks == NULL)
        return NULL;
    /* Make room first, so that the touches below cannot fail half way. */
    if (reserve_slots(s, n) < 0 || reserve_log(s, n) < 0) {
        PyMem_Free(ks);
        return NULL;
    }
    for (Py_ssize_t j = 0; j < n; j++) {
        uint64_t k = ks[reverse ? n - 1 - j : j];
        size_t i = spot(k, s->mask);
        while (s->slots[i].pos >= 0 && s->slots[i].key != k)
            i = (i + 1) & s->mask;
        if (s->slots[i].pos < 0) {
            s->slots[i].key = k;
            s->n++;
        }
        s->slots[i].pos = s->hi;
        s->log[s->hi].key = k;
        s->log[s->hi].t = now;
        s->hi++;
    }
    PyMem_Free(ks);
    if (s->n > s->capacity)
        return pop_oldest(s, s->n - s->capacity + s->capacity / EVICT_BATCH_DIVISOR, 0, 0.0);
    return PyList_New(0);
}

static PyObject *
lru_touch(Lru *s, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "touch(keys, now)");
        return NULL;
    }
    return touch(s, args[0], args[1], 0);
}

static PyObject *
lru_touch_chain(Lru *s, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "touch_chain(chain, now)");
        return NULL;
    }
    return touch(s, args[0], args[1], 1);
}

static PyObject *
lru_discard(Lru *s, PyObject *keys)
{
    PyObject *seq = PySequence_Fast(keys, "keys must be iterable");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *out = PyList_New(0);
    for (Py_ssize_t j = 0; out != NULL && j < n; j++) {
        uint64_t k;
        if (!key_value(items[j], &k))
            continue;
        Py_ssize_t i = find(s, k);
        if (i < 0)
            continue;
        if (PyList_Append(out, items[j]) < 0)
            Py_CLEAR(out);
        else
            remove_slot(s, (size_t)i);
    }
    Py_DECREF(seq);
    if (s->n == 0)
        s->lo = s->hi = 0;
    return out;
}

static PyObject *
lru_clear(Lru *s, PyObject *unused)
{
    /* Give a large table's memory back, as dict.clear() does. */
    if (s->mask + 1 > MIN_SLOTS) {
        slot *t = empty_slots(MIN_SLOTS);
        if (t != NULL) {
            PyMem_Free(s->slots);
            s->slots = t;
            s->mask = MIN_SLOTS - 1;
        }
    }
    if (s->room > MIN_LOG) {
        touch_mark *log = PyMem_Realloc(s->log, sizeof(touch_mark) * MIN_LOG);
        if (log != NULL) {
            s->log = log;
            s->room = MIN_LOG;
        }
    }
    reset(s);
    Py_RETURN_NONE;
}

/* -- walks ------------------------------------------------------------------------------- */

/* Whether keys[i] is held (and, with ``timed``, touched after ``horizon``). */
static inline int
holds(const Lru *s, PyObject **keys, Py_ssize_t i, int timed, double horizon)
{
    uint64_t k;
    if (!key_value(keys[i], &k))
        return 0;
    Py_ssize_t at = find(s, k);
    return at >= 0 && (!timed || s->log[s->slots[at].pos].t > horizon);
}

/* The reference's galloping search (LruKeys.leading), probe for probe. */
static Py_ssize_t
leading_keys(const Lru *s, PyObject **keys, Py_ssize_t n, int timed, double horizon)
{
    if (n == 0 || !holds(s, keys, 0, timed, horizon))
        return 0;
    Py_ssize_t lo = 0, step = 1;
    while (lo + step < n && holds(s, keys, lo + step, timed, horizon)) {
        lo += step;
        step *= 2;
    }
    Py_ssize_t hi = lo + step < n ? lo + step : n;
    while (hi - lo > 1) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (holds(s, keys, mid, timed, horizon))
            lo = mid;
        else
            hi = mid;
    }
    return lo + 1;
}

Py_ssize_t
lru_leading(PyObject *lru, PyObject **keys, Py_ssize_t n, PyObject *horizon)
{
    double h = 0.0;
    if (horizon != NULL) {
        h = PyFloat_AsDouble(horizon);
        if (h == -1.0 && PyErr_Occurred())
            return -1;
    }
    return leading_keys((const Lru *)lru, keys, n, horizon != NULL, h);
}

static PyObject *
lru_leading_method(Lru *s, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "leading(keys, now=None)");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[0], "keys must be a sequence");
    if (seq == NULL)
        return NULL;
    PyObject *horizon = NULL;
    if (nargs == 2 && args[1] != Py_None && s->ttl != Py_None) {
        horizon = PyNumber_Subtract(args[1], s->ttl);
        if (horizon == NULL) {
            Py_DECREF(seq);
            return NULL;
        }
    }
    Py_ssize_t n = lru_leading(
        (PyObject *)s, PySequence_Fast_ITEMS(seq), PySequence_Fast_GET_SIZE(seq), horizon);
    Py_XDECREF(horizon);
    Py_DECREF(seq);
    return n < 0 ? NULL : PyLong_FromSsize_t(n);
}

static PyObject *
lru_leading_since(Lru *s, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "leading_since(keys, since)");
        return NULL;
    }
    double since = PyFloat_AsDouble(args[1]);
    if (since == -1.0 && PyErr_Occurred())
        return NULL;
    PyObject *seq = PySequence_Fast(args[0], "keys must be a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), held = 0;
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (; held < n; held++) {
        uint64_t k;
        Py_ssize_t at;
        if (!key_value(items[held], &k) || (at = find(s, k)) < 0)
            break;
        if (s->log[s->slots[at].pos].t <= since) /* the reference's test, NaN included */
            break;
    }
    Py_DECREF(seq);
    return PyLong_FromSsize_t(held);
}

/* -- the rest of LruKeys' face ------------------------------------------------------------ */

static Py_ssize_t
lru_len(Lru *s)
{
    return s->n;
}

static int
lru_contains(Lru *s, PyObject *key)
{
    uint64_t k;
    return key_value(key, &k) && find(s, k) >= 0;
}

static PyObject *
lru_self(PyObject *s, PyObject *unused)
{
    return Py_NewRef(s);
}

static PyObject *
lru_get_capacity(Lru *s, void *unused)
{
    return PyLong_FromSsize_t(s->capacity);
}

static int
lru_set_capacity(Lru *s, PyObject *value, void *unused)
{
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "capacity cannot be deleted");
        return -1;
    }
    Py_ssize_t c = PyNumber_AsSsize_t(value, PyExc_OverflowError);
    if (c == -1 && PyErr_Occurred())
        return -1;
    s->capacity = c;
    return 0;
}

static PyObject *
lru_get_ttl(Lru *s, void *unused)
{
    return Py_NewRef(s->ttl);
}

static PyObject *
lru_sizeof(Lru *s, PyObject *unused)
{
    return PyLong_FromSize_t(sizeof(Lru) + sizeof(slot) * (s->mask + 1) +
                             sizeof(touch_mark) * (size_t)s->room);
}

static PyMethodDef lru_methods[] = {
    {"touch", (PyCFunction)(void (*)(void))lru_touch, METH_FASTCALL,
     "touch(keys, now): insert or refresh keys, the last most recent; the keys evicted."},
    {"touch_chain", (PyCFunction)(void (*)(void))lru_touch_chain, METH_FASTCALL,
     "touch_chain(chain, now): touch a chain deepest block first; the keys evicted."},
    {"evict", (PyCFunction)lru_evict, METH_O,
     "evict(count): remove and return up to count of the least recently touched keys."},
    {"expire", (PyCFunction)lru_expire, METH_O,
     "expire(now): remove and return the keys untouched for longer than the ttl."},
    {"discard", (PyCFunction)lru_discard, METH_O,
     "discard(keys): remove the keys present; those that were."},
    {"clear", (PyCFunction)lru_clear, METH_NOARGS, "clear(): hold nothing."},
    {"evicted_age", (PyCFunction)(void (*)(void))lru_evicted_age, METH_FASTCALL,
     "evicted_age(count, now): how long ago the newest key count new ones push out was touched."},
    {"leading", (PyCFunction)(void (*)(void))lru_leading_method, METH_FASTCALL,
     "leading(keys, now=None): how many of keys, from the first, are held (and fresh)."},
    {"leading_since", (PyCFunction)(void (*)(void))lru_leading_since, METH_FASTCALL,
     "leading_since(keys, since): how many of keys, from the first, were touched after since."},
    {"items", (PyCFunction)lru_items, METH_NOARGS, "items(): (key, time) pairs, oldest first."},
    {"keys", (PyCFunction)lru_self, METH_NOARGS, "keys(): the set itself, for probes."},
    {"table", (PyCFunction)lru_self, METH_NOARGS,
     "table(): the set itself, which the compiled overlaps walk probes."},
    {"__sizeof__", (PyCFunction)lru_sizeof, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef lru_getset[] = {
    {"capacity", (getter)lru_get_capacity, (setter)lru_set_capacity, "keys held at most", NULL},
    {"ttl", (getter)lru_get_ttl, NULL, "the age limit in seconds, or None", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods lru_as_sequence = {
    .sq_length = (lenfunc)lru_len,
    .sq_contains = (objobjproc)lru_contains,
};

PyTypeObject LruType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "router.core._hotpath.Lru",
    .tp_basicsize = sizeof(Lru),
    .tp_dealloc = (destructor)lru_dealloc,
    .tp_as_sequence = &lru_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Lru(capacity, ttl=None): the compiled LruKeys (router.core.lru).",
    .tp_iter = (getiterfunc)lru_iter,
    .tp_methods = lru_methods,
    .tp_getset = lru_getset,
    .tp_new = lru_new,
};
