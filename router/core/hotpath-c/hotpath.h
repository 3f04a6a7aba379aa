/* What the sources of router.core._hotpath share: the functions scoring.c and otlp.c define,
 * which hotpath.c registers in the module (each takes its arguments as METH_FASTCALL does),
 * and lru.c's type with the walk the index's overlaps run over it. */

#ifndef KVROUTER_HOTPATH_H
#define KVROUTER_HOTPATH_H

#include <Python.h>

PyObject *hp_under_cap(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *hp_ttft_costs(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *hp_falling(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *hp_shares(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *hp_weighted(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *hp_rank(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *hp_otlp_spans(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

extern PyTypeObject LruType;
/* How many of ``keys``, from the first, the Lru holds (touched after ``horizon`` unless it is
 * NULL); -1 on an error. */
Py_ssize_t lru_leading(PyObject *lru, PyObject **keys, Py_ssize_t n, PyObject *horizon);

#endif
