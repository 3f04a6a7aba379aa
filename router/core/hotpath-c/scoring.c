/* The arithmetic of a routing decision over its candidates, compiled: the bounded-load cap
 * (router/core/ring.py), the scorers' per-candidate figures (router/core/scorers), their
 * weighted totals and the ranking of the fallbacks (router/core/pickers.py). Part of
 * router.core._hotpath; hotpath.c registers these functions (hotpath.h declares them).
 *
 * Each has a pure-Python twin, the reference; the property tests compare the two bit for bit.
 * Floats are computed in the reference's order of operations, and the extension is built so
 * that no multiply-add is fused into one rounding (setup.py). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>

#include "hotpath.h"

/* -- exact arithmetic on the figures of a decision ------------------------------------------
 *
 * The functions below compute what their Python twins compute with ints and floats. They read
 * ints into long longs, and refuse (OverflowError; TypeError for a value of another type) what
 * they cannot compute exactly that way: the caller then runs the reference, which copes with
 * any int. Within +-2**53 an int converts to a double exactly, so true division and mixed
 * comparisons agree with Python's; past that only exact integer sums are taken. */

#define EXACT_INT (1LL << 53)

/* The error that hands a computation over to the reference: -1. */
static int
overflowed(void)
{
    PyErr_SetString(PyExc_OverflowError, "a figure past what is computed exactly here");
    return -1;
}

/* ``v`` (an int) into ``*out``; ``limit``: its largest magnitude. 0, or -1 with an error. */
static int
read_int(PyObject *v, long long limit, long long *out)
{
    if (!PyLong_Check(v)) {
        PyErr_SetString(PyExc_TypeError, "an int was expected");
        return -1;
    }
    int overflow;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (x == -1 && PyErr_Occurred())
        return -1;
    if (overflow || x > limit || x < -limit)
        return overflowed();
    *out = x;
    return 0;
}

/* A number (int or float) as a double, exactly: ints only within +-2**53. */
static int
read_number(PyObject *v, double *out)
{
    if (PyFloat_Check(v)) {
        *out = PyFloat_AS_DOUBLE(v);
        return 0;
    }
    long long x;
    if (read_int(v, EXACT_INT, &x) < 0)
        return -1;
    *out = (double)x;
    return 0;
}

/* A column of per-candidate figures, ``n`` long, or empty (``*items`` NULL: zeros). */
static int
column(PyObject *seq, Py_ssize_t n, int may_be_empty, PyObject ***items)
{
    Py_ssize_t len = PySequence_Fast_GET_SIZE(seq);
    if (len == 0 && may_be_empty) {
        *items = NULL;
        return 0;
    }
    if (len != n) {
        PyErr_SetString(PyExc_ValueError, "the per-candidate lists differ in length");
        return -1;
    }
    *items = PySequence_Fast_ITEMS(seq);
    return 0;
}

/* The first ``k`` arguments as fast sequences into ``out``; 0, or -1 with an error (and none
 * left held). */
static int
sequences(PyObject *const *args, Py_ssize_t k, PyObject **out)
{
    for (Py_ssize_t i = 0; i < k; i++) {
        out[i] = PySequence_Fast(args[i], "a sequence was expected");
        if (out[i] == NULL) {
            while (i-- > 0)
                Py_DECREF(out[i]);
            return -1;
        }
    }
    return 0;
}

static void
release_all(PyObject **seqs, Py_ssize_t k)
{
    for (Py_ssize_t i = 0; i < k; i++)
        Py_DECREF(seqs[i]);
}

/* under_cap(loads, weight, epsilon, min_cap) -> [bool]: router/core/ring.py's ``under_cap``
 * in one pass: the cap from the loads' least and sum, then each load against it. */
PyObject *
hp_under_cap(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "under_cap(loads, weight, epsilon, min_cap)");
        return NULL;
    }
    long long weight, min_cap, *v = NULL;
    double epsilon;
    if (read_int(args[1], EXACT_INT, &weight) < 0 || read_number(args[2], &epsilon) < 0 ||
        read_int(args[3], EXACT_INT, &min_cap) < 0)
        return NULL;
    PyObject *seq = PySequence_Fast(args[0], "loads must be a sequence"), *out = NULL;
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    if (n == 0) {
        out = PyList_New(0);
        goto done;
    }
    if ((v = PyMem_Malloc(sizeof(long long) * (size_t)n)) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    long long least = 0, total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (read_int(items[i], EXACT_INT, &v[i]) < 0)
            goto done;
        if (i == 0 || v[i] < least)
            least = v[i];
        if (__builtin_add_overflow(total, v[i], &total)) {
            overflowed();
            goto done;
        }
    }
    /* floor = max(least + weight, min_cap * weight); cap = max(ceil((1 + eps) x (total +
     * weight) / n) as a float, floor); limit = floor(cap) - weight. */
    long long lifted, least_cap, floor_cap, sum;
    if (__builtin_add_overflow(least, weight, &lifted) ||
        __builtin_mul_overflow(min_cap, weight, &least_cap) ||
        __builtin_add_overflow(total, weight, &sum)) {
        overflowed();
        goto done;
    }
    floor_cap = lifted > least_cap ? lifted : least_cap;
    double mean_cap = ceil((1.0 + epsilon) * (double)sum / (double)n);
    if (!isfinite(mean_cap) || floor_cap > EXACT_INT || floor_cap < -EXACT_INT ||
        mean_cap > (double)EXACT_INT || mean_cap < -(double)EXACT_INT) {
        overflowed();
        goto done;
    }
    long long cap = (double)floor_cap > mean_cap ? floor_cap : (long long)mean_cap, limit;
    if (__builtin_sub_overflow(cap, weight, &limit)) {
        overflowed();
        goto done;
    }
    if ((out = PyList_New(n)) == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++)
        PyList_SET_ITEM(out, i, Py_NewRef(v[i] <= limit ? Py_True : Py_False));
done:
    PyMem_Free(v);
    Py_DECREF(seq);
    return out;
}

/* -- scoring (router/core/scorers) --------------------------------------------------------- */

/* ttft_costs(overlaps, tokens, requests, waiting, usage, prompt_tokens, block_tokens,
 * wait_tokens, running_tokens, kv_pressure) -> [float]: ttft-estimate's ``costs`` per
 * candidate; ``waiting`` or ``usage`` empty: zeros. */
PyObject *
hp_ttft_costs(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError,
                        "ttft_costs(overlaps, tokens, requests, waiting, usage, prompt_tokens,"
                        " block_tokens, wait_tokens, running_tokens, kv_pressure)");
        return NULL;
    }
    long long pt, bt, wt, rt;
    double knee;
    if (read_int(args[5], LLONG_MAX, &pt) < 0 || read_int(args[6], LLONG_MAX, &bt) < 0 ||
        read_int(args[7], LLONG_MAX, &wt) < 0 || read_int(args[8], LLONG_MAX, &rt) < 0 ||
        read_number(args[9], &knee) < 0)
        return NULL;
    PyObject *seqs[5], *out = NULL;
    if (sequences(args, 5, seqs) < 0)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seqs[0]);
    PyObject **ov = PySequence_Fast_ITEMS(seqs[0]), **tk, **rq, **wa, **us;
    if (column(seqs[1], n, 0, &tk) < 0 || column(seqs[2], n, 0, &rq) < 0 ||
        column(seqs[3], n, 1, &wa) < 0 || column(seqs[4], n, 1, &us) < 0)
        goto done;
    if ((out = PyList_New(n)) == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        long long o, queued, r, w = 0, cached, uncached, running, waits, runs, cost;
        double u = 0.0;
        if (read_int(ov[i], LLONG_MAX, &o) < 0 || read_int(tk[i], LLONG_MAX, &queued) < 0 ||
            read_int(rq[i], LLONG_MAX, &r) < 0 ||
            (wa != NULL && read_int(wa[i], LLONG_MAX, &w) < 0))
            goto fail;
        if (us != NULL) {
            if (!PyFloat_Check(us[i])) { /* an int compares with kv_pressure exactly in Python */
                PyErr_SetString(PyExc_TypeError, "kv usage must be a float");
                goto fail;
            }
            u = PyFloat_AS_DOUBLE(us[i]);
        }
        if (__builtin_mul_overflow(o, bt, &cached))
            goto overflow;
        if (cached && u > knee) {
            /* cached = int(cached * (1 - u, or 0 from a full cache) / (1 - kv_pressure)) */
            double den = 1.0 - knee, c = (double)cached * (u < 1.0 ? 1.0 - u : 0.0) / den;
            if (den == 0.0 || !isfinite(c) || c >= 9.2e18 || c <= -9.2e18)
                goto overflow; /* the reference raises what Python raises */
            cached = (long long)c;
        }
        uncached = 0;
        if (pt > cached && __builtin_sub_overflow(pt, cached, &uncached))
            goto overflow;
        running = 0;
        if (r > w && __builtin_sub_overflow(r, w, &running))
            goto overflow;
        if (__builtin_mul_overflow(wt, w, &waits) || __builtin_mul_overflow(rt, running, &runs) ||
            __builtin_add_overflow(queued, uncached, &cost) ||
            __builtin_add_overflow(cost, waits, &cost) || __builtin_add_overflow(cost, runs, &cost))
            goto overflow;
        PyObject *f = PyFloat_FromDouble((double)cost);
        if (f == NULL)
            goto fail;
        PyList_SET_ITEM(out, i, f);
    }
    goto done;
overflow:
    overflowed();
fail:
    Py_CLEAR(out);
done:
    release_all(seqs, 5);
    return out;
}

/* falling(costs) -> [float]: per cost, 1 - cost / the largest cost; every one 1.0 when the
 * largest is not above 0 (router/core/scorers/base.py). */
PyObject *
hp_falling(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 1) {
        PyErr_SetString(PyExc_TypeError, "falling(costs)");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[0], "costs must be a sequence"), *out = NULL;
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    double *v = PyMem_Malloc(sizeof(double) * (size_t)(n ? n : 1)), top = 0.0;
    if (v == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (read_number(items[i], &v[i]) < 0)
            goto done;
        if (i == 0 || v[i] > top) /* max()'s own test: the first of equals, NaN kept first */
            top = v[i];
    }
    if ((out = PyList_New(n)) == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *f = PyFloat_FromDouble(top <= 0.0 ? 1.0 : 1.0 - v[i] / top);
        if (f == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, f);
    }
done:
    PyMem_Free(v);
    Py_DECREF(seq);
    return out;
}

/* shares(overlaps, blocks, waiting) -> [float]: prefix-overlap's score, each overlap over
 * ``blocks``, divided by one more than the candidate's wait (``waiting`` empty: not). */
PyObject *
hp_shares(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "shares(overlaps, blocks, waiting)");
        return NULL;
    }
    long long blocks;
    if (read_int(args[1], EXACT_INT, &blocks) < 0)
        return NULL;
    if (blocks == 0) {
        overflowed(); /* the reference raises ZeroDivisionError */
        return NULL;
    }
    PyObject *given[2] = {args[0], args[2]}, *seqs[2], *out = NULL;
    if (sequences(given, 2, seqs) < 0)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seqs[0]);
    PyObject **ov = PySequence_Fast_ITEMS(seqs[0]), **wa;
    if (column(seqs[1], n, 1, &wa) < 0 || (out = PyList_New(n)) == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        long long o, w = 0;
        if (read_int(ov[i], EXACT_INT, &o) < 0 ||
            (wa != NULL && read_int(wa[i], EXACT_INT - 1, &w) < 0))
            goto fail;
        double share = (double)o / (double)blocks;
        if (wa != NULL) {
            if (w == -1) {
                overflowed(); /* the reference raises ZeroDivisionError */
                goto fail;
            }
            share = share / (double)(1 + w);
        }
        PyObject *f = PyFloat_FromDouble(share);
        if (f == NULL)
            goto fail;
        PyList_SET_ITEM(out, i, f);
    }
    goto done;
fail:
    Py_CLEAR(out);
done:
    release_all(seqs, 2);
    return out;
}

/* weighted(weights, columns) -> [float]: per candidate, the sum over the scorers of weight x
 * score, in the scorers' order from 0.0, scorers of weight 0 skipped (RoutingCore.decide_keys).
 * Scores must be floats. */
PyObject *
hp_weighted(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "weighted(weights, columns, n)");
        return NULL;
    }
    Py_ssize_t n = PyLong_AsSsize_t(args[2]);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    PyObject *seqs[2], *out = NULL;
    if (sequences(args, 2, seqs) < 0)
        return NULL;
    Py_ssize_t k = PySequence_Fast_GET_SIZE(seqs[0]);
    PyObject **ws = PySequence_Fast_ITEMS(seqs[0]);
    PyObject **cols = PySequence_Fast_ITEMS(seqs[1]);
    double *t = PyMem_Calloc((size_t)(n ? n : 1), sizeof(double));
    if (t == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (PySequence_Fast_GET_SIZE(seqs[1]) != k) {
        PyErr_SetString(PyExc_ValueError, "one column per weight");
        goto done;
    }
    for (Py_ssize_t j = 0; j < k; j++) {
        double w;
        if (read_number(ws[j], &w) < 0)
            goto done;
        if (w == 0.0)
            continue;
        if (!PyList_Check(cols[j])) {
            PyErr_SetString(PyExc_TypeError, "every column must be a list");
            goto done;
        }
        if (PyList_GET_SIZE(cols[j]) != n) {
            PyErr_SetString(PyExc_ValueError, "every column must hold n scores");
            goto done;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *v = PyList_GET_ITEM(cols[j], i);
            if (!PyFloat_Check(v)) {
                PyErr_SetString(PyExc_TypeError, "a score must be a float");
                goto done;
            }
            t[i] = t[i] + w * PyFloat_AS_DOUBLE(v); /* never fused: see setup.py */
        }
    }
    if ((out = PyList_New(n)) == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *f = PyFloat_FromDouble(t[i]);
        if (f == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, f);
    }
done:
    PyMem_Free(t);
    release_all(seqs, 2);
    return out;
}

typedef struct {
    int ineligible;
    double total;
    long long requests;
    Py_ssize_t pos;
} standing;

/* ``a`` ranks before ``b``: eligible first, then the higher total, then fewer requests, then
 * the earlier candidate (Python's stable sort on the same key). */
static int
ranks_before(const standing *a, const standing *b)
{
    if (a->ineligible != b->ineligible)
        return a->ineligible < b->ineligible;
    if (a->total != b->total)
        return a->total > b->total;
    if (a->requests != b->requests)
        return a->requests < b->requests;
    return a->pos < b->pos;
}

/* rank(eligible, totals, requests) -> [int]: the candidates' positions, best first, as
 * ``sorted(range(n), key=lambda i: (not eligible[i], -totals[i], requests[i]))``. */
PyObject *
hp_rank(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "rank(eligible, totals, requests)");
        return NULL;
    }
    PyObject *seqs[3], *out = NULL;
    if (sequences(args, 3, seqs) < 0)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seqs[0]);
    PyObject **el = PySequence_Fast_ITEMS(seqs[0]), **tt, **rq;
    standing *s = PyMem_Malloc(sizeof(standing) * (size_t)(n ? n : 1));
    if (s == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (column(seqs[1], n, 0, &tt) < 0 || column(seqs[2], n, 0, &rq) < 0)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        int ok = PyObject_IsTrue(el[i]);
        if (ok < 0 || read_number(tt[i], &s[i].total) < 0 ||
            read_int(rq[i], LLONG_MAX, &s[i].requests) < 0)
            goto done;
        if (isnan(s[i].total)) { /* NaN orders as Python's sort happens to leave it */
            overflowed();
            goto done;
        }
        s[i].ineligible = !ok;
        s[i].pos = i;
        /* An insertion sort: a decision ranks the ten or so candidates it scored. */
        standing x = s[i];
        Py_ssize_t j = i;
        while (j > 0 && ranks_before(&x, &s[j - 1])) {
            s[j] = s[j - 1];
            j--;
        }
        s[j] = x;
    }
    if ((out = PyList_New(n)) == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyLong_FromSsize_t(s[i].pos);
        if (v == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, v);
    }
done:
    PyMem_Free(s);
    release_all(seqs, 3);
    return out;
}
