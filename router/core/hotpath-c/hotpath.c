/* router.core._hotpath: the routing decision's per-block and per-engine loops, compiled.
 *
 * Each function here has a pure-Python twin in router/core (blocks, lru, index, predictions,
 * shortlist); that twin is the reference, and the property tests hold the two to identical
 * results. router/core/hotpath.py decides which one runs. The arithmetic over the scored
 * candidates (the cap, the scores, their totals and ranking) is in scoring.c; otlp.c writes
 * the router's trace spans onto OTLP's wire, the one loop here that is not the decision's.
 *
 * Written against the CPython C API rather than Cython: the code is a handful of tight loops
 * over dicts, lists and byte buffers, which the C API expresses directly, and the build then
 * needs nothing beyond a C compiler and the Python headers (no build dependency from PyPI).
 *
 * The LRU sets of block keys are a type of their own, ``Lru`` (lru.c): keys and times in
 * plain C arrays rather than Python objects in a dict, which is what makes a touch cheap and
 * an index entry smaller. Claims stay ordinary dicts, shared with the reference.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "hotpath.h"

#define XXH_INLINE_ALL
#include "xxhash.h"

/* -- chained block hashes ------------------------------------------------------------------ */

/* Keys of the full blocks of ``size`` bytes at ``data``: each block's xxh3_64 seeded with the
 * key before it. */
static PyObject *
chain_bytes(const char *data, Py_ssize_t len, Py_ssize_t size, XXH64_hash_t seed)
{
    Py_ssize_t n = size > 0 ? len / size : 0;
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    XXH64_hash_t h = seed;
    for (Py_ssize_t i = 0; i < n; i++) {
        h = XXH3_64bits_withSeed(data + i * size, (size_t)size, h);
        PyObject *key = PyLong_FromUnsignedLongLong(h);
        if (key == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, key);
    }
    return out;
}

static int
read_size_seed(PyObject *const *args, Py_ssize_t *size, XXH64_hash_t *seed)
{
    *size = PyLong_AsSsize_t(args[1]);
    if (*size == -1 && PyErr_Occurred())
        return -1;
    if (*size == 0) {
        PyErr_SetString(PyExc_ValueError, "block size must not be zero");
        return -1;
    }
    /* As xxhash's own binding reads a seed: its low 64 bits. */
    *seed = PyLong_AsUnsignedLongLongMask(args[2]);
    if (*seed == (XXH64_hash_t)-1 && PyErr_Occurred())
        return -1;
    return 0;
}

static PyObject *
hp_chain(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "chain(data, size, seed)");
        return NULL;
    }
    Py_ssize_t size;
    XXH64_hash_t seed;
    if (read_size_seed(args, &size, &seed) < 0)
        return NULL;
    if (size < 0) /* no full block, as a range() with a negative step over the data */
        return PyList_New(0);
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *out = chain_bytes(view.buf, view.len, size, seed);
    PyBuffer_Release(&view);
    return out;
}

static PyObject *
hp_text_chain(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyUnicode_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "text_chain(text: str, size, seed)");
        return NULL;
    }
    PyObject *text = args[0];
    Py_ssize_t size;
    XXH64_hash_t seed;
    if (read_size_seed(args, &size, &seed) < 0)
        return NULL;
    if (size < 0)
        return PyList_New(0);
    Py_ssize_t len = PyUnicode_GET_LENGTH(text);
    if (PyUnicode_IS_ASCII(text))
        /* One character is one byte, and CPython keeps ASCII text as exactly those bytes. */
        return chain_bytes((const char *)PyUnicode_1BYTE_DATA(text), len, size, seed);
    /* Otherwise each block of characters is encoded on its own, as UTF-8 with lone
     * surrogates passed through (what the pure code hashes). */
    Py_ssize_t n = len / size;
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    XXH64_hash_t h = seed;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *piece = PyUnicode_Substring(text, i * size, (i + 1) * size);
        if (piece == NULL)
            goto fail;
        PyObject *raw = PyUnicode_AsEncodedString(piece, "utf-8", "surrogatepass");
        Py_DECREF(piece);
        if (raw == NULL)
            goto fail;
        h = XXH3_64bits_withSeed(PyBytes_AS_STRING(raw), (size_t)PyBytes_GET_SIZE(raw), h);
        Py_DECREF(raw);
        PyObject *key = PyLong_FromUnsignedLongLong(h);
        if (key == NULL)
            goto fail;
        PyList_SET_ITEM(out, i, key);
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

/* -- the longest-prefix walk --------------------------------------------------------------- */

/* Whether keys[i] is held in ``table`` (and, with a horizon, touched after it): 1, 0, or -1
 * on an error. */
static int
held(PyObject *table, PyObject **keys, Py_ssize_t i, PyObject *horizon)
{
    PyObject *t = PyDict_GetItemWithError(table, keys[i]);
    if (t == NULL)
        return PyErr_Occurred() ? -1 : 0;
    if (horizon == NULL)
        return 1;
    Py_INCREF(t); /* held across a comparison, which may run code */
    int fresh = PyObject_RichCompareBool(t, horizon, Py_GT);
    Py_DECREF(t);
    return fresh;
}

/* How many of ``keys``, from the first, ``table`` holds, assuming the held ones form a prefix
 * (``LruKeys.leading``): a galloping search, then bisection. -1 on an error. */
static Py_ssize_t
leading(PyObject *table, PyObject **keys, Py_ssize_t n, PyObject *horizon)
{
    int r;
    if (n == 0)
        return 0;
    if ((r = held(table, keys, 0, horizon)) <= 0)
        return r;
    Py_ssize_t lo = 0, step = 1;
    while (lo + step < n) {
        if ((r = held(table, keys, lo + step, horizon)) < 0)
            return -1;
        if (!r)
            break;
        lo += step;
        step *= 2;
    }
    Py_ssize_t hi = lo + step < n ? lo + step : n;
    while (hi - lo > 1) {
        Py_ssize_t mid = (lo + hi) / 2;
        if ((r = held(table, keys, mid, horizon)) < 0)
            return -1;
        if (r)
            lo = mid;
        else
            hi = mid;
    }
    return lo + 1;
}

/* overlaps(tables, engines, keys, now, ttls): per engine, the leading blocks of ``keys`` its
 * table (``tables[engine]``: a compiled ``Lru``, or the reference's dict) holds; an engine in
 * ``ttls`` counts only blocks touched after ``now - ttls[engine]`` (when ``now`` is not None). */
static PyObject *
hp_overlaps(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5 || !PyDict_Check(args[0]) || !PyDict_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "overlaps(tables, engines, keys, now, ttls)");
        return NULL;
    }
    PyObject *tables = args[0], *now = args[3], *ttls = args[4];
    PyObject *engines = PySequence_Fast(args[1], "engines must be a sequence");
    if (engines == NULL)
        return NULL;
    PyObject *keys = PySequence_Fast(args[2], "keys must be a sequence");
    if (keys == NULL) {
        Py_DECREF(engines);
        return NULL;
    }
    Py_ssize_t m = PySequence_Fast_GET_SIZE(engines), n = PySequence_Fast_GET_SIZE(keys);
    PyObject **names = PySequence_Fast_ITEMS(engines), **ks = PySequence_Fast_ITEMS(keys);
    int timed = now != Py_None && PyDict_GET_SIZE(ttls) > 0;
    PyObject *out = PyList_New(m);
    if (out == NULL)
        goto done;
    PyObject *zero = PyLong_FromLong(0);
    for (Py_ssize_t i = 0; i < m; i++) {
        Py_ssize_t depth = 0;
        PyObject *table = n ? PyDict_GetItemWithError(tables, names[i]) : NULL;
        if (table == NULL && PyErr_Occurred())
            goto fail;
        if (table != NULL && Py_IS_TYPE(table, &LruType)) {
            PyObject *ttl = timed ? PyDict_GetItemWithError(ttls, names[i]) : NULL;
            PyObject *horizon = ttl != NULL ? PyNumber_Subtract(now, ttl) : NULL;
            depth = PyErr_Occurred() ? -1 : lru_leading(table, ks, n, horizon);
            Py_XDECREF(horizon);
            if (depth < 0)
                goto fail;
        }
        /* Most engines do not hold the first block: one probe rules them out. */
        else if (table != NULL && PyDict_Check(table)) {
            int first = PyDict_Contains(table, ks[0]);
            if (first < 0)
                goto fail;
            Py_INCREF(table); /* a borrowed table must outlive the walk's lookups */
            if (first) {
                PyObject *ttl = timed ? PyDict_GetItemWithError(ttls, names[i]) : NULL;
                PyObject *horizon = ttl != NULL ? PyNumber_Subtract(now, ttl) : NULL;
                if (PyErr_Occurred())
                    depth = -1;
                else
                    depth = leading(table, ks, n, horizon);
                Py_XDECREF(horizon);
            }
            Py_DECREF(table);
            if (depth < 0)
                goto fail;
        }
        PyObject *v = depth ? PyLong_FromSsize_t(depth) : Py_NewRef(zero);
        if (v == NULL)
            goto fail;
        PyList_SET_ITEM(out, i, v);
    }
    Py_DECREF(zero);
    goto done;
fail:
    Py_DECREF(zero);
    Py_CLEAR(out);
done:
    Py_DECREF(engines);
    Py_DECREF(keys);
    return out;
}

/* -- LRU touches --------------------------------------------------------------------------- */

/* Remove ``key`` from ``d`` when present: 1 removed, 0 absent, -1 error. */
static int
pop_key(PyObject *d, PyObject *key)
{
#if PY_VERSION_HEX >= 0x030D0000
    return PyDict_Pop(d, key, NULL);
#else
    /* One probe instead of a membership test and a delete (public as PyDict_Pop in 3.13). */
    PyObject *v = _PyDict_Pop(d, key, Py_None);
    if (v == NULL)
        return -1;
    int present = v != Py_None;
    Py_DECREF(v);
    return present;
#endif
}

/* discard(table, keys): remove the keys present; the list of those that were. */
static PyObject *
hp_discard(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyDict_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "discard(table: dict, keys)");
        return NULL;
    }
    PyObject *d = args[0];
    PyObject *seq = PySequence_Fast(args[1], "keys must be a sequence");
    if (seq == NULL)
        return NULL;
    PyObject *out = PyList_New(0);
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **ks = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t j = 0; out != NULL && j < n; j++) {
        int r = pop_key(d, ks[j]);
        if (r < 0 || (r && PyList_Append(out, ks[j]) < 0))
            Py_CLEAR(out);
    }
    Py_DECREF(seq);
    return out;
}

/* -- claims (router/core/predictions.py) --------------------------------------------------- */

/* claim(counts, keys): one more claim on each key. */
static PyObject *
hp_claim(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyDict_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "claim(counts: dict, keys)");
        return NULL;
    }
    PyObject *d = args[0];
    PyObject *seq = PySequence_Fast(args[1], "keys must be a sequence");
    if (seq == NULL)
        return NULL;
    PyObject *one = PyLong_FromLong(1);
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **ks = PySequence_Fast_ITEMS(seq);
    int ok = 1;
    for (Py_ssize_t j = 0; ok && j < n; j++) {
        PyObject *c = PyDict_GetItemWithError(d, ks[j]);
        if (c == NULL) {
            ok = !PyErr_Occurred() && PyDict_SetItem(d, ks[j], one) == 0;
            continue;
        }
        PyObject *more = PyNumber_Add(c, one);
        ok = more != NULL && PyDict_SetItem(d, ks[j], more) == 0;
        Py_XDECREF(more);
    }
    Py_DECREF(one);
    Py_DECREF(seq);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

/* withdraw(counts, keys): one claim fewer on each key claimed; the keys no claim is left on. */
static PyObject *
hp_withdraw(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyDict_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "withdraw(counts: dict, keys)");
        return NULL;
    }
    PyObject *d = args[0];
    PyObject *seq = PySequence_Fast(args[1], "keys must be a sequence");
    if (seq == NULL)
        return NULL;
    PyObject *gone = PyList_New(0);
    PyObject *one = PyLong_FromLong(1);
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **ks = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t j = 0; gone != NULL && j < n; j++) {
        PyObject *k = ks[j];
        PyObject *c = PyDict_GetItemWithError(d, k);
        if (c == NULL) {
            if (PyErr_Occurred())
                Py_CLEAR(gone);
            continue; /* confirmed meanwhile */
        }
        int more = PyObject_RichCompareBool(c, one, Py_GT);
        if (more < 0) {
            Py_CLEAR(gone);
        }
        else if (more) {
            PyObject *less = PyNumber_Subtract(c, one);
            if (less == NULL || PyDict_SetItem(d, k, less) < 0)
                Py_CLEAR(gone);
            Py_XDECREF(less);
        }
        else {
            Py_INCREF(k); /* the dict's reference goes with the item */
            if (PyDict_DelItem(d, k) < 0 || PyList_Append(gone, k) < 0)
                Py_CLEAR(gone);
            Py_DECREF(k);
        }
    }
    Py_DECREF(one);
    Py_DECREF(seq);
    return gone;
}

/* -- the shortlist's passes (router/core/shortlist.py) ------------------------------------- */

typedef struct {
    long long primary, secondary;
    Py_ssize_t pos;
} ranked;

/* ``a`` before ``b``: smaller (primary, secondary), then the earlier position (a stable sort). */
static int
before(const ranked *a, const ranked *b)
{
    if (a->primary != b->primary)
        return a->primary < b->primary;
    if (a->secondary != b->secondary)
        return a->secondary < b->secondary;
    return a->pos < b->pos;
}

/* Keep the ``k`` first of the candidates offered, in order, in ``best`` (``*have`` of them). */
static void
offer(ranked *best, Py_ssize_t k, Py_ssize_t *have, ranked r)
{
    Py_ssize_t i = *have < k ? (*have)++ : k;
    if (i == k) {
        if (!before(&r, &best[k - 1]))
            return;
        i = k - 1;
    }
    while (i > 0 && before(&r, &best[i - 1])) {
        best[i] = best[i - 1];
        i--;
    }
    best[i] = r;
}

static int
read_ints(PyObject *seq, long long *out, Py_ssize_t n)
{
    if (PySequence_Fast_GET_SIZE(seq) != n) {
        PyErr_SetString(PyExc_ValueError, "the per-candidate lists differ in length");
        return -1;
    }
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        out[i] = PyLong_AsLongLong(items[i]);
        if (out[i] == -1 && PyErr_Occurred())
            return -1;
    }
    return 0;
}

/* shortlist(overlaps, requests, eligible, holders, spares) -> (positions, tie): the positions
 * of the ``holders`` deepest holders (then least loaded) and the ``spares`` least loaded
 * eligible non-holders, ascending; ``tie``: nobody holds the prefix and more eligible engines
 * than are kept tie with the least loaded spare. Raises OverflowError past 64-bit figures. */
static PyObject *
hp_shortlist(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "shortlist(overlaps, requests, eligible, holders, spares)");
        return NULL;
    }
    Py_ssize_t kh = PyLong_AsSsize_t(args[3]), ks = PyLong_AsSsize_t(args[4]);
    if ((kh == -1 || ks == -1) && PyErr_Occurred())
        return NULL;
    if (kh < 1 || ks < 1) {
        PyErr_SetString(PyExc_ValueError, "holders and spares must be at least 1");
        return NULL;
    }
    PyObject *result = NULL, *ov = NULL, *rq = NULL, *el = NULL;
    long long *o = NULL, *r = NULL;
    ranked *best = NULL;
    if ((ov = PySequence_Fast(args[0], "overlaps must be a sequence")) == NULL ||
        (rq = PySequence_Fast(args[1], "requests must be a sequence")) == NULL ||
        (el = PySequence_Fast(args[2], "eligible must be a sequence")) == NULL)
        goto done;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(ov);
    o = PyMem_Malloc(sizeof(long long) * (size_t)(n ? n : 1));
    r = PyMem_Malloc(sizeof(long long) * (size_t)(n ? n : 1));
    best = PyMem_Malloc(sizeof(ranked) * (size_t)(kh + ks));
    if (o == NULL || r == NULL || best == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (read_ints(ov, o, n) < 0 || read_ints(rq, r, n) < 0)
        goto done;
    if (PySequence_Fast_GET_SIZE(el) != n) {
        PyErr_SetString(PyExc_ValueError, "the per-candidate lists differ in length");
        goto done;
    }
    PyObject **elig = PySequence_Fast_ITEMS(el);
    ranked *holders = best, *spares = best + kh;
    Py_ssize_t nh = 0, ns = 0, held = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (o[i]) {
            held++;
            if (o[i] == LLONG_MIN) {
                PyErr_SetString(PyExc_OverflowError, "overlap out of range");
                goto done;
            }
            offer(holders, kh, &nh, (ranked){-o[i], r[i], i});
            continue;
        }
        int e = PyObject_IsTrue(elig[i]);
        if (e < 0)
            goto done;
        if (e)
            offer(spares, ks, &ns, (ranked){r[i], 0, i});
    }
    int tie = 0;
    if (!held && ns) {
        /* Among the eligible engines (none holds anything), those as idle as the idlest. */
        long long low = spares[0].primary;
        Py_ssize_t same = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            if (r[i] != low)
                continue;
            int e = PyObject_IsTrue(elig[i]);
            if (e < 0)
                goto done;
            same += e;
        }
        tie = same > ns;
    }
    /* Holders and spares are disjoint: mark them, then list the marks in order. */
    unsigned char *mark = PyMem_Calloc((size_t)(n ? n : 1), 1);
    if (mark == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < nh; i++)
        mark[holders[i].pos] = 1;
    for (Py_ssize_t i = 0; i < ns; i++)
        mark[spares[i].pos] = 1;
    PyObject *keep = PyList_New(nh + ns);
    Py_ssize_t j = 0;
    for (Py_ssize_t i = 0; keep != NULL && i < n; i++) {
        if (!mark[i])
            continue;
        PyObject *v = PyLong_FromSsize_t(i);
        if (v == NULL) {
            Py_CLEAR(keep);
            break;
        }
        PyList_SET_ITEM(keep, j++, v);
    }
    PyMem_Free(mark);
    if (keep != NULL) {
        result = Py_BuildValue("(NO)", keep, tie ? Py_True : Py_False);
    }
done:
    PyMem_Free(o);
    PyMem_Free(r);
    PyMem_Free(best);
    Py_XDECREF(ov);
    Py_XDECREF(rq);
    Py_XDECREF(el);
    return result;
}

/* narrow(keep, cands, columns): (the candidates whose names are not at ``keep``'s positions,
 * in order; each column taken at ``keep``'s positions). */
static PyObject *
hp_narrow(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyList_Check(args[0]) || !PyList_Check(args[1]) ||
        !PyTuple_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "narrow(keep: list, cands: list, columns: tuple)");
        return NULL;
    }
    PyObject *keep = args[0], *cands = args[1], *columns = args[2];
    Py_ssize_t k = PyList_GET_SIZE(keep), n = PyList_GET_SIZE(cands);
    Py_ssize_t ncols = PyTuple_GET_SIZE(columns);
    PyObject *kept = NULL, *unscored = NULL, *taken = NULL;
    Py_ssize_t *pos = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(k ? k : 1));
    if (pos == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t j = 0; j < k; j++) {
        pos[j] = PyLong_AsSsize_t(PyList_GET_ITEM(keep, j));
        if (pos[j] == -1 && PyErr_Occurred())
            goto fail;
        if (pos[j] < 0 || pos[j] >= n) {
            PyErr_SetString(PyExc_IndexError, "a kept position is not a candidate's");
            goto fail;
        }
    }
    if ((kept = PySet_New(NULL)) == NULL)
        goto fail;
    for (Py_ssize_t j = 0; j < k; j++)
        if (PySet_Add(kept, PyList_GET_ITEM(cands, pos[j])) < 0)
            goto fail;
    if ((unscored = PyList_New(0)) == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *c = PyList_GET_ITEM(cands, i);
        int in = PySet_Contains(kept, c);
        if (in < 0 || (!in && PyList_Append(unscored, c) < 0))
            goto fail;
    }
    if ((taken = PyTuple_New(ncols)) == NULL)
        goto fail;
    for (Py_ssize_t c = 0; c < ncols; c++) {
        PyObject *col = PyTuple_GET_ITEM(columns, c);
        if (!PyList_Check(col) || PyList_GET_SIZE(col) != n) {
            PyErr_SetString(PyExc_ValueError, "every column must be a list as long as cands");
            goto fail;
        }
        PyObject *out = PyList_New(k);
        if (out == NULL)
            goto fail;
        for (Py_ssize_t j = 0; j < k; j++)
            PyList_SET_ITEM(out, j, Py_NewRef(PyList_GET_ITEM(col, pos[j])));
        PyTuple_SET_ITEM(taken, c, out);
    }
    PyMem_Free(pos);
    Py_DECREF(kept);
    return Py_BuildValue("(NN)", unscored, taken);
fail:
    PyMem_Free(pos);
    Py_XDECREF(kept);
    Py_XDECREF(unscored);
    Py_XDECREF(taken);
    return NULL;
}

/* -- the module ---------------------------------------------------------------------------- */

static PyMethodDef methods[] = {
    {"chain", (PyCFunction)(void (*)(void))hp_chain, METH_FASTCALL,
     "chain(data, size, seed): chained xxh3_64 keys of the full blocks of size bytes."},
    {"text_chain", (PyCFunction)(void (*)(void))hp_text_chain, METH_FASTCALL,
     "text_chain(text, size, seed): chained keys of the full blocks of size characters."},
    {"overlaps", (PyCFunction)(void (*)(void))hp_overlaps, METH_FASTCALL,
     "overlaps(tables, engines, keys, now, ttls): leading keys each engine's table holds."},
    {"discard", (PyCFunction)(void (*)(void))hp_discard, METH_FASTCALL,
     "discard(table, keys): remove the keys present; those that were."},
    {"claim", (PyCFunction)(void (*)(void))hp_claim, METH_FASTCALL,
     "claim(counts, keys): one more claim on each key."},
    {"withdraw", (PyCFunction)(void (*)(void))hp_withdraw, METH_FASTCALL,
     "withdraw(counts, keys): one claim fewer on each; the keys left with none."},
    {"shortlist", (PyCFunction)(void (*)(void))hp_shortlist, METH_FASTCALL,
     "shortlist(overlaps, requests, eligible, holders, spares): (positions, tie)."},
    {"narrow", (PyCFunction)(void (*)(void))hp_narrow, METH_FASTCALL,
     "narrow(keep, cands, columns): (candidates left out, each column at keep)."},
    {"under_cap", (PyCFunction)(void (*)(void))hp_under_cap, METH_FASTCALL,
     "under_cap(loads, weight, epsilon, min_cap): per load, whether it stays under the cap."},
    {"ttft_costs", (PyCFunction)(void (*)(void))hp_ttft_costs, METH_FASTCALL,
     "ttft_costs(overlaps, tokens, requests, waiting, usage, ...): ttft-estimate's costs."},
    {"falling", (PyCFunction)(void (*)(void))hp_falling, METH_FASTCALL,
     "falling(costs): per cost, 1 - cost / the largest (all 1.0 when it is not above 0)."},
    {"shares", (PyCFunction)(void (*)(void))hp_shares, METH_FASTCALL,
     "shares(overlaps, blocks, waiting): prefix-overlap's score per candidate."},
    {"weighted", (PyCFunction)(void (*)(void))hp_weighted, METH_FASTCALL,
     "weighted(weights, columns, n): per candidate, the weighted sum of its scores."},
    {"rank", (PyCFunction)(void (*)(void))hp_rank, METH_FASTCALL,
     "rank(eligible, totals, requests): the candidates' positions, best first."},
    {"otlp_spans", (PyCFunction)(void (*)(void))hp_otlp_spans, METH_FASTCALL,
     "otlp_spans(spans): trace spans as a ScopeSpans message's spans fields (otlp.c)."},
    {NULL, NULL, 0, NULL},
};

static int
exec_module(PyObject *m)
{
    if (PyType_Ready(&LruType) < 0)
        return -1;
    return PyModule_AddObjectRef(m, "Lru", (PyObject *)&LruType);
}

static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, exec_module},
    {0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "router.core._hotpath",
    "The routing decision's per-block and per-engine loops, compiled (router.core.hotpath).",
    0,
    methods,
    slots,
    NULL, /* m_traverse */
    NULL, /* m_clear */
    NULL, /* m_free */
};

PyMODINIT_FUNC
PyInit__hotpath(void)
{
    return PyModuleDef_Init(&module);
}
