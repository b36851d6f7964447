/* CPython + NumPy glue only: parse arguments, validate shapes and dtypes,
 * convert arrays (dtype, byte order, alignment, contiguity), release the
 * GIL and call the kernels with plain pointers, sizes and strides. Every
 * error names the argument it is about. Nothing here computes. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define PY_ARRAY_UNIQUE_SYMBOL ATTNC_ARRAY_API
#include <numpy/arrayobject.h>

#include "attnc.h"

/* ======================================================================== */
/* conversions                                                              */

static int dtype_code(PyArray_Descr *descr, attnc_dtype *code)
{
    if (descr->type_num == NPY_FLOAT) *code = ATTNC_F32;
    else if (descr->type_num == NPY_DOUBLE) *code = ATTNC_F64;
    else {
        PyErr_SetString(PyExc_TypeError, "dtype: expected float32 or float64");
        return 0;
    }
    return 1;
}

/* "O&" converter: a dtype argument that must be float32 or float64. */
static int dtype_converter(PyObject *obj, void *out)
{
    PyArray_Descr *descr = NULL;
    if (!PyArray_DescrConverter(obj, &descr)) return 0;
    int ok = dtype_code(descr, out);
    Py_DECREF(descr);
    return ok;
}

/* Only real numbers: bool, integers and floats convert; complex, object,
 * strings, void and datetimes raise TypeError naming the argument. */
static int check_real_kind(PyArrayObject *arr, const char *name)
{
    char kind = PyArray_DESCR(arr)->kind;
    if (kind == 'b' || kind == 'i' || kind == 'u' || kind == 'f') return 1;
    PyErr_Format(PyExc_TypeError, "%s: unsupported dtype %R; expected real numbers (bool, int or float)",
                 name, (PyObject *)PyArray_DESCR(arr));
    return 0;
}

/* obj as an aligned, native-byte-order array of `dt` (a new reference).
 * With contiguous, C-contiguous too; copies only what needs converting. */
static PyArrayObject *as_real_array(PyObject *obj, const char *name, attnc_dtype dt, int contiguous)
{
    PyArrayObject *raw = (PyArrayObject *)PyArray_FROM_O(obj);
    if (!raw) return NULL;
    if (!check_real_kind(raw, name)) {
        Py_DECREF(raw);
        return NULL;
    }
    int flags = NPY_ARRAY_ALIGNED | NPY_ARRAY_NOTSWAPPED | NPY_ARRAY_FORCECAST |
                (contiguous ? NPY_ARRAY_C_CONTIGUOUS : 0);
    PyArray_Descr *descr = PyArray_DescrFromType(dt == ATTNC_F32 ? NPY_FLOAT : NPY_DOUBLE);
    PyArrayObject *arr = (PyArrayObject *)PyArray_FromAny((PyObject *)raw, descr, 0, 0, flags, NULL);
    Py_DECREF(raw);
    return arr;
}

/* As above, and the last axis has unit stride (rows read as plain vectors). */
static PyArrayObject *as_row_major(PyObject *obj, const char *name, attnc_dtype dt)
{
    PyArrayObject *arr = as_real_array(obj, name, dt, 0);
    if (!arr) return NULL;
    int nd = PyArray_NDIM(arr);
    if (nd > 0 && PyArray_DIM(arr, nd - 1) > 1 && PyArray_STRIDE(arr, nd - 1) != PyArray_ITEMSIZE(arr)) {
        PyArrayObject *copy = (PyArrayObject *)PyArray_NewCopy(arr, NPY_CORDER);
        Py_DECREF(arr);
        return copy;
    }
    return arr;
}

static idx_t elem_stride(PyArrayObject *arr, int axis)
{
    return PyArray_STRIDE(arr, axis) / PyArray_ITEMSIZE(arr);
}

static PyObject *new_array(int nd, const npy_intp *shape, attnc_dtype dt)
{
    return PyArray_SimpleNew(nd, (npy_intp *)shape, dt == ATTNC_F32 ? NPY_FLOAT : NPY_DOUBLE);
}

static int check_dropout_p(double p, const char *name)
{
    if (p >= 0 && p <= 1) return 1;
    PyObject *value = PyFloat_FromDouble(p);
    if (value) {
        PyErr_Format(PyExc_ValueError, "%s: expected a probability in [0, 1], got %R", name, value);
        Py_DECREF(value);
    }
    return 0;
}

static PyObject *status_error(attnc_status status, const char *what)
{
    if (status == ATTNC_ENOMEM) return PyErr_Format(PyExc_MemoryError, "%s: out of memory for the workspace", what);
    return PyErr_Format(PyExc_MemoryError, "%s: the workspace size overflows", what);
}

static int check_min_ndim(PyArrayObject *arr, const char *name, int min_nd, const char *layout)
{
    if (PyArray_NDIM(arr) >= min_nd) return 1;
    PyErr_Format(PyExc_ValueError, "%s: expected at least %d dimensions %s, got %d",
                 name, min_nd, layout, PyArray_NDIM(arr));
    return 0;
}

static int check_dim(PyArrayObject *arr, const char *name, int axis, npy_intp expected, const char *what)
{
    npy_intp got = PyArray_DIM(arr, axis < 0 ? PyArray_NDIM(arr) + axis : axis);
    if (got == expected) return 1;
    PyErr_Format(PyExc_ValueError, "%s: expected %s of size %zd, got %zd", name, what,
                 (Py_ssize_t)expected, (Py_ssize_t)got);
    return 0;
}

/* ======================================================================== */
/* broadcast batch dimensions                                               */

/* shape[:nd] <- the broadcast of the leading (batch) dims of arrays, each
 * of which has `skip` trailing non-batch dims, right-aligned. */
static int broadcast_batch(PyArrayObject **arrays, const char **names, int n, int skip,
                           int *nd, npy_intp *shape)
{
    *nd = 0;
    for (int i = 0; i < n; i++)
        if (PyArray_NDIM(arrays[i]) - skip > *nd) *nd = PyArray_NDIM(arrays[i]) - skip;
    for (int d = 0; d < *nd; d++) shape[d] = 1;
    for (int i = 0; i < n; i++) {
        int ad = PyArray_NDIM(arrays[i]) - skip;
        for (int d = 0; d < ad; d++) {
            npy_intp size = PyArray_DIM(arrays[i], d), *target = &shape[*nd - ad + d];
            if (size == *target || size == 1) continue;
            if (*target == 1) { *target = size; continue; }
            PyErr_Format(PyExc_ValueError, "%s: batch dimensions do not broadcast with those of %s",
                         names[i], names[0]);
            return 0;
        }
    }
    return 1;
}

/* strides (elements) of arr's batch dims aligned to a broadcast batch of nd dims */
static void batch_strides(PyArrayObject *arr, int skip, int nd, idx_t *strides)
{
    int ad = PyArray_NDIM(arr) - skip;
    for (int d = 0; d < nd; d++) {
        int a = d - (nd - ad);
        strides[d] = (a < 0 || PyArray_DIM(arr, a) == 1) ? 0 : elem_stride(arr, a);
    }
}

static int count_items(int nd, const npy_intp *shape, idx_t *count, const char *what)
{
    *count = 1;
    for (int d = 0; d < nd; d++)
        if (!attnc_mul_ok(*count, shape[d], count)) {
            PyErr_Format(PyExc_MemoryError, "%s: the broadcast batch is too large", what);
            return 0;
        }
    return 1;
}

/* offsets (a new PyMem buffer) of arr's matrices over a broadcast batch */
static idx_t *batch_offsets(PyArrayObject *arr, int skip, int nd, const npy_intp *shape, idx_t count)
{
    idx_t strides[NPY_MAXDIMS];
    batch_strides(arr, skip, nd, strides);
    idx_t *offsets = PyMem_Malloc(sizeof(idx_t) * (size_t)(count > 0 ? count : 1));
    if (!offsets) {
        PyErr_NoMemory();
        return NULL;
    }
    attnc_broadcast_offsets(nd, (const idx_t *)shape, strides, offsets);
    return offsets;
}

/* ======================================================================== */
/* masks                                                                    */

typedef struct {
    PyArrayObject *keep; /* bool, aligned; NULL when no mask */
    idx_t *offsets;      /* one per item */
    idx_t row_stride, col_stride;
} mask_view;

static void mask_release(mask_view *m)
{
    Py_XDECREF(m->keep);
    PyMem_Free(m->offsets);
}

/* A mask that broadcasts to scores (nd dims: batch..., L, S) as a bool
 * array of its own (un-broadcast) size: zero-stride axes are collapsed to
 * length 1 before casting, so a broadcast view is never expanded. Nonzero
 * (NaN included) keeps a position, as bool(x) does. */
static int mask_prepare(PyObject *obj, const char *name, int nd, const npy_intp *scores_shape,
                        idx_t n_items, mask_view *m)
{
    m->keep = NULL;
    m->offsets = NULL;
    if (obj == Py_None) return 1;
    PyArrayObject *raw = (PyArrayObject *)PyArray_FROM_O(obj);
    if (!raw) return 0;
    if (!check_real_kind(raw, name)) goto fail_raw;
    int md = PyArray_NDIM(raw);
    int fits = md <= nd;
    for (int d = 0; fits && d < md; d++) {
        npy_intp size = PyArray_DIM(raw, d);
        fits = size == 1 || size == scores_shape[nd - md + d];
    }
    if (!fits) {
        PyObject *target = PyTuple_New(nd);
        if (target)
            for (int d = 0; d < nd; d++) PyTuple_SET_ITEM(target, d, PyLong_FromSsize_t(scores_shape[d]));
        PyObject *given = PyObject_GetAttrString((PyObject *)raw, "shape");
        if (target && given)
            PyErr_Format(PyExc_ValueError, "%s: shape %R does not broadcast to the scores' shape %R",
                         name, given, target);
        Py_XDECREF(target);
        Py_XDECREF(given);
        goto fail_raw;
    }
    npy_intp dims[NPY_MAXDIMS], strides[NPY_MAXDIMS];
    for (int d = 0; d < md; d++) {
        strides[d] = PyArray_STRIDE(raw, d);
        dims[d] = strides[d] == 0 ? 1 : PyArray_DIM(raw, d);
    }
    PyArray_Descr *raw_descr = PyArray_DESCR(raw);
    Py_INCREF(raw_descr);
    PyArrayObject *collapsed = (PyArrayObject *)PyArray_NewFromDescr(
        &PyArray_Type, raw_descr, md, dims, strides, PyArray_DATA(raw), 0, NULL);
    if (!collapsed) goto fail_raw;
    if (PyArray_SetBaseObject(collapsed, (PyObject *)raw) < 0) { /* steals raw */
        Py_DECREF(collapsed);
        return 0;
    }
    m->keep = (PyArrayObject *)PyArray_FromAny((PyObject *)collapsed, PyArray_DescrFromType(NPY_BOOL),
                                               0, 0, NPY_ARRAY_ALIGNED | NPY_ARRAY_FORCECAST, NULL);
    Py_DECREF(collapsed);
    if (!m->keep) return 0;
    idx_t aligned[NPY_MAXDIMS + 2]; /* scores have up to two more dims than x */
    for (int d = 0; d < nd; d++) {
        int a = d - (nd - md);
        aligned[d] = (a < 0 || PyArray_DIM(m->keep, a) == 1) ? 0 : PyArray_STRIDE(m->keep, a);
    }
    m->row_stride = aligned[nd - 2];
    m->col_stride = aligned[nd - 1];
    m->offsets = PyMem_Malloc(sizeof(idx_t) * (size_t)(n_items > 0 ? n_items : 1));
    if (!m->offsets) {
        PyErr_NoMemory();
        return 0;
    }
    attnc_broadcast_offsets(nd - 2, (const idx_t *)scores_shape, aligned, m->offsets);
    return 1;
fail_raw:
    Py_DECREF(raw);
    return 0;
}

/* ======================================================================== */
/* linear(x, weight, bias, dtype) -> x @ weight.T + bias                     */

static PyObject *py_linear(PyObject *self, PyObject *args)
{
    PyObject *x_obj, *w_obj, *b_obj, *result = NULL;
    attnc_dtype dt;
    if (!PyArg_ParseTuple(args, "OOOO&:linear", &x_obj, &w_obj, &b_obj, dtype_converter, &dt)) return NULL;
    PyArrayObject *x = as_real_array(x_obj, "x", dt, 1), *w = NULL, *b = NULL;
    if (!x || !check_min_ndim(x, "x", 1, "(..., in_features)")) goto done;
    if (!(w = as_real_array(w_obj, "weight", dt, 0))) goto done;
    if (PyArray_NDIM(w) != 2) {
        PyErr_Format(PyExc_ValueError, "weight: expected 2 dimensions (out_features, in_features), got %d",
                     PyArray_NDIM(w));
        goto done;
    }
    npy_intp n_out = PyArray_DIM(w, 0), n_in = PyArray_DIM(w, 1);
    if (!check_dim(x, "x", -1, n_in, "last dimension (in_features)")) goto done;
    if (b_obj != Py_None) {
        if (!(b = as_real_array(b_obj, "bias", dt, 1))) goto done;
        if (PyArray_NDIM(b) != 1 || PyArray_DIM(b, 0) != n_out) {
            PyErr_Format(PyExc_ValueError, "bias: expected shape (%zd,)", (Py_ssize_t)n_out);
            goto done;
        }
    }
    int nd = PyArray_NDIM(x);
    npy_intp shape[NPY_MAXDIMS];
    for (int d = 0; d < nd - 1; d++) shape[d] = PyArray_DIM(x, d);
    shape[nd - 1] = n_out;
    if (!(result = new_array(nd, shape, dt))) goto done;
    idx_t rows;
    if (!count_items(nd - 1, shape, &rows, "x")) Py_CLEAR(result);
    if (!result) goto done;
    attnc_status status;
    Py_BEGIN_ALLOW_THREADS
    status = attnc_gemm(dt, rows, n_out, n_in, PyArray_DATA(x), n_in, 1, PyArray_DATA(w),
                        elem_stride(w, 0), elem_stride(w, 1), b ? PyArray_DATA(b) : NULL,
                        PyArray_DATA((PyArrayObject *)result), n_out);
    Py_END_ALLOW_THREADS
    if (status != ATTNC_OK) {
        Py_CLEAR(result);
        status_error(status, "linear");
    }
done:
    Py_XDECREF(x);
    Py_XDECREF(w);
    Py_XDECREF(b);
    return result;
}

/* ======================================================================== */
/* softmax(x, axis, dtype)                                                  */

static PyObject *py_softmax(PyObject *self, PyObject *args)
{
    PyObject *x_obj;
    int axis;
    attnc_dtype dt;
    if (!PyArg_ParseTuple(args, "OiO&:softmax", &x_obj, &axis, dtype_converter, &dt)) return NULL;
    PyArrayObject *x = as_real_array(x_obj, "x", dt, 1);
    if (!x) return NULL;
    int nd = PyArray_NDIM(x);
    int span = nd > 0 ? nd : 1; /* a 0-d array is one row of one element */
    if (axis < -span || axis >= span) {
        PyErr_Format(PyExc_ValueError, "axis: %d is out of range for an array of %d dimensions", axis, nd);
        Py_DECREF(x);
        return NULL;
    }
    if (axis < 0) axis += span;
    idx_t outer = 1, n = nd > 0 ? PyArray_DIM(x, axis) : 1, inner = 1;
    if (PyArray_SIZE(x) == 0) { /* nothing to do; the products below could overflow */
        outer = 0;
    } else {
        for (int d = 0; d < axis; d++) outer *= PyArray_DIM(x, d);
        for (int d = axis + 1; d < nd; d++) inner *= PyArray_DIM(x, d);
    }
    PyObject *result = new_array(nd, PyArray_DIMS(x), dt);
    if (result) {
        attnc_status status;
        Py_BEGIN_ALLOW_THREADS
        status = attnc_softmax(dt, PyArray_DATA((PyArrayObject *)result), PyArray_DATA(x), outer, n, inner);
        Py_END_ALLOW_THREADS
        if (status != ATTNC_OK) {
            Py_CLEAR(result);
            status_error(status, "softmax");
        }
    }
    Py_DECREF(x);
    return result;
}

/* ======================================================================== */
/* dropout(x, p, seed, dtype)                                               */

static PyObject *py_dropout(PyObject *self, PyObject *args)
{
    PyObject *x_obj;
    double p;
    unsigned long long seed;
    attnc_dtype dt;
    if (!PyArg_ParseTuple(args, "OdKO&:dropout", &x_obj, &p, &seed, dtype_converter, &dt)) return NULL;
    if (!check_dropout_p(p, "p")) return NULL;
    PyArrayObject *x = as_real_array(x_obj, "x", dt, 1);
    if (!x) return NULL;
    PyObject *result = new_array(PyArray_NDIM(x), PyArray_DIMS(x), dt);
    if (result) {
        Py_BEGIN_ALLOW_THREADS
        attnc_dropout(dt, PyArray_DATA((PyArrayObject *)result), PyArray_DATA(x), PyArray_SIZE(x), p, seed);
        Py_END_ALLOW_THREADS
    }
    Py_DECREF(x);
    return result;
}

/* ======================================================================== */
/* scaled_dot_product_attention                                             */

static PyObject *pack_result(PyObject *out, PyObject *weights)
{
    if (!out) {
        Py_XDECREF(weights);
        return NULL;
    }
    if (!weights) return out;
    PyObject *pair = PyTuple_Pack(2, out, weights);
    Py_DECREF(out);
    Py_DECREF(weights);
    return pair;
}


static PyObject *py_sdpa(PyObject *self, PyObject *args)
{
    PyObject *q_obj, *k_obj, *v_obj, *mask_obj, *out = NULL, *weights = NULL;
    double dropout_p, scale;
    int is_causal, want_weights;
    unsigned long long seed;
    attnc_dtype dt;
    if (!PyArg_ParseTuple(args, "OOOOdpdKpO&:scaled_dot_product_attention", &q_obj, &k_obj, &v_obj,
                          &mask_obj, &dropout_p, &is_causal, &scale, &seed, &want_weights, dtype_converter, &dt))
        return NULL;
    if (!check_dropout_p(dropout_p, "dropout_p")) return NULL;
    if (!isfinite(scale)) return PyErr_Format(PyExc_ValueError, "scale: expected a finite number");

    PyArrayObject *arr[3] = {NULL, NULL, NULL};
    const char *names[3] = {"query", "key", "value"};
    const char *layouts[3] = {"(..., L, E)", "(..., S, E)", "(..., S, Ev)"};
    PyObject *objs[3] = {q_obj, k_obj, v_obj};
    idx_t *offsets[4] = {NULL, NULL, NULL, NULL}; /* q, k, v, out */
    mask_view mask = {NULL, NULL, 0, 0};
    for (int i = 0; i < 3; i++)
        if (!(arr[i] = as_row_major(objs[i], names[i], dt)) || !check_min_ndim(arr[i], names[i], 2, layouts[i]))
            goto done;
    npy_intp L = PyArray_DIM(arr[0], PyArray_NDIM(arr[0]) - 2), E = PyArray_DIM(arr[0], PyArray_NDIM(arr[0]) - 1);
    npy_intp S = PyArray_DIM(arr[1], PyArray_NDIM(arr[1]) - 2);
    npy_intp Ev = PyArray_DIM(arr[2], PyArray_NDIM(arr[2]) - 1);
    if (!check_dim(arr[1], "key", -1, E, "last dimension (E, as query)") ||
        !check_dim(arr[2], "value", -2, S, "sequence dimension (S, as key)"))
        goto done;
    int nb;
    npy_intp shape[NPY_MAXDIMS + 2];
    idx_t n_items;
    if (!broadcast_batch(arr, names, 3, 2, &nb, shape) || !count_items(nb, shape, &n_items, "query"))
        goto done;
    for (int i = 0; i < 3; i++)
        if (!(offsets[i] = batch_offsets(arr[i], 2, nb, shape, n_items))) goto done;
    if (!(offsets[3] = PyMem_Malloc(sizeof(idx_t) * (size_t)(n_items > 0 ? n_items : 1)))) {
        PyErr_NoMemory();
        goto done;
    }
    idx_t out_matrix;
    if (!attnc_mul_ok(L, Ev, &out_matrix)) {
        PyErr_SetString(PyExc_MemoryError, "scaled_dot_product_attention: the output is too large");
        goto done;
    }
    for (idx_t b = 0; b < n_items; b++) offsets[3][b] = b * out_matrix;

    shape[nb] = L;
    shape[nb + 1] = S;
    if (!mask_prepare(mask_obj, "attn_mask", nb + 2, shape, n_items, &mask)) goto done;
    if (want_weights && !(weights = new_array(nb + 2, shape, dt))) goto done;
    shape[nb + 1] = Ev;
    if (!(out = new_array(nb + 2, shape, dt))) goto done;

    attnc_attention_args a = {
        .dtype = dt, .n_items = n_items, .L = L, .S = S, .E = E, .Ev = Ev,
        .q = PyArray_DATA(arr[0]), .q_off = offsets[0], .q_rs = elem_stride(arr[0], PyArray_NDIM(arr[0]) - 2),
        .k = PyArray_DATA(arr[1]), .k_off = offsets[1], .k_rs = elem_stride(arr[1], PyArray_NDIM(arr[1]) - 2),
        .v = PyArray_DATA(arr[2]), .v_off = offsets[2], .v_rs = elem_stride(arr[2], PyArray_NDIM(arr[2]) - 2),
        .mask = mask.keep ? PyArray_DATA(mask.keep) : NULL, .mask_off = mask.offsets,
        .mask_rs = mask.row_stride, .mask_cs = mask.col_stride,
        .is_causal = is_causal, .scale = scale, .dropout_p = dropout_p, .seed = seed,
        .out = PyArray_DATA((PyArrayObject *)out), .out_off = offsets[3], .out_rs = Ev,
        .weights = weights ? PyArray_DATA((PyArrayObject *)weights) : NULL,
    };
    attnc_status status;
    Py_BEGIN_ALLOW_THREADS
    status = attnc_attention(&a);
    Py_END_ALLOW_THREADS
    if (status != ATTNC_OK) {
        Py_CLEAR(out);
        Py_CLEAR(weights);
        status_error(status, "scaled_dot_product_attention");
    }
done:
    if (PyErr_Occurred()) {
        Py_CLEAR(out);
        Py_CLEAR(weights);
    }
    for (int i = 0; i < 3; i++) Py_XDECREF(arr[i]);
    for (int i = 0; i < 4; i++) PyMem_Free(offsets[i]);
    mask_release(&mask);
    return pack_result(out, weights);
}

/* ======================================================================== */
/* self_attention: a whole module forward                                   */

/* A parameter array of the module: exactly dtype dt, C-contiguous, shape
 * (rows, cols) or (rows,) for a bias (cols < 0). None allowed if optional. */
static int get_param(PyObject *obj, const char *name, attnc_dtype dt, npy_intp rows, npy_intp cols,
                     int optional, const void **data)
{
    *data = NULL;
    if (obj == Py_None && optional) return 1;
    int type = dt == ATTNC_F32 ? NPY_FLOAT : NPY_DOUBLE;
    if (!PyArray_Check(obj) || PyArray_TYPE((PyArrayObject *)obj) != type ||
        !PyArray_ISCARRAY_RO((PyArrayObject *)obj)) {
        PyErr_Format(PyExc_TypeError, "%s: expected an aligned C-contiguous %s array", name,
                     dt == ATTNC_F32 ? "float32" : "float64");
        return 0;
    }
    PyArrayObject *arr = (PyArrayObject *)obj;
    int nd = cols < 0 ? 1 : 2;
    if (PyArray_NDIM(arr) != nd || PyArray_DIM(arr, 0) != rows || (nd == 2 && PyArray_DIM(arr, 1) != cols)) {
        PyErr_Format(PyExc_ValueError, "%s: unexpected shape", name);
        return 0;
    }
    *data = PyArray_DATA(arr);
    return 1;
}

static PyObject *py_self_attention(PyObject *self, PyObject *args)
{
    PyObject *x_obj, *w_obj[3], *b_obj[3], *wo_obj, *bo_obj, *mask_obj, *out = NULL, *weights = NULL;
    Py_ssize_t n_heads;
    int heads_axis, want_weights;
    double scale, dropout_p;
    unsigned long long seed;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOnpdOdKp:self_attention", &x_obj, &w_obj[0], &b_obj[0], &w_obj[1],
                          &b_obj[1], &w_obj[2], &b_obj[2], &wo_obj, &bo_obj, &n_heads, &heads_axis, &scale,
                          &mask_obj, &dropout_p, &seed, &want_weights))
        return NULL;
    if (!PyArray_Check(w_obj[0]))
        return PyErr_Format(PyExc_TypeError, "query weight: expected a float32 or float64 array");
    attnc_dtype dt;
    if (!dtype_code(PyArray_DESCR((PyArrayObject *)w_obj[0]), &dt)) return NULL;
    if (!check_dropout_p(dropout_p, "dropout")) return NULL;
    if (!isfinite(scale)) return PyErr_Format(PyExc_ValueError, "scale: expected a finite number");
    if (n_heads < 1) return PyErr_Format(PyExc_ValueError, "n_heads: expected at least 1, got %zd", n_heads);

    attnc_self_attention_args s = {.dtype = dt, .H = n_heads, .scale = scale, .dropout_p = dropout_p, .seed = seed};
    static const char *w_names[3] = {"query weight", "key weight", "value weight"};
    static const char *b_names[3] = {"query bias", "key bias", "value bias"};
    idx_t C = PyArray_Check(w_obj[0]) && PyArray_NDIM((PyArrayObject *)w_obj[0]) == 2
                  ? PyArray_DIM((PyArrayObject *)w_obj[0], 1) : 0;
    for (int p = 0; p < 3; p++) {
        s.dim[p] = PyArray_Check(w_obj[p]) && PyArray_NDIM((PyArrayObject *)w_obj[p]) >= 1
                       ? PyArray_DIM((PyArrayObject *)w_obj[p], 0) : 0;
        if (!get_param(w_obj[p], w_names[p], dt, s.dim[p], C, 0, &s.w[p]) ||
            !get_param(b_obj[p], b_names[p], dt, s.dim[p], -1, 1, &s.bias[p]))
            return NULL;
    }
    if (s.dim[0] != s.dim[1] || s.dim[0] % n_heads || s.dim[2] % n_heads)
        return PyErr_Format(PyExc_ValueError, "n_heads: %zd heads do not split query/key size %zd and value size %zd",
                            n_heads, (Py_ssize_t)s.dim[1], (Py_ssize_t)s.dim[2]);
    if (wo_obj != Py_None) {
        s.n_out = PyArray_Check(wo_obj) ? PyArray_DIM((PyArrayObject *)wo_obj, 0) : 0;
        if (!get_param(wo_obj, "output weight", dt, s.n_out, s.dim[2], 0, &s.w_out) ||
            !get_param(bo_obj, "output bias", dt, s.n_out, -1, 1, &s.bias_out))
            return NULL;
    }

    mask_view mask = {NULL, NULL, 0, 0};
    PyArrayObject *x = as_real_array(x_obj, "x", dt, 1);
    if (!x || !check_min_ndim(x, "x", 2, "(..., seq, dim)") || !check_dim(x, "x", -1, C, "last dimension"))
        goto done;
    int nb = PyArray_NDIM(x) - 2;
    npy_intp shape[NPY_MAXDIMS + 1];
    for (int d = 0; d < nb; d++) shape[d] = PyArray_DIM(x, d);
    s.C = C;
    s.T = PyArray_DIM(x, nb);
    s.x = PyArray_DATA(x);
    idx_t n_items;
    if (!count_items(nb, shape, &s.B, "x") || !attnc_mul_ok(s.B, s.H, &n_items)) {
        PyErr_SetString(PyExc_MemoryError, "x: the batch is too large");
        goto done;
    }
    int ns = nb; /* scores: batch..., [heads,] seq, seq */
    if (heads_axis) shape[ns++] = n_heads;
    shape[ns] = s.T;
    shape[ns + 1] = s.T;
    if (!mask_prepare(mask_obj, "attention_mask", ns + 2, shape, n_items, &mask)) goto done;
    s.mask = mask.keep ? PyArray_DATA(mask.keep) : NULL;
    s.mask_off = mask.offsets;
    s.mask_rs = mask.row_stride;
    s.mask_cs = mask.col_stride;
    if (want_weights && !(weights = new_array(ns + 2, shape, dt))) goto done;
    shape[nb + 1] = s.w_out ? s.n_out : s.dim[2];
    shape[nb] = s.T;
    if (!(out = new_array(nb + 2, shape, dt))) goto done;
    s.out = PyArray_DATA((PyArrayObject *)out);
    s.weights = weights ? PyArray_DATA((PyArrayObject *)weights) : NULL;

    attnc_status status;
    Py_BEGIN_ALLOW_THREADS
    status = attnc_self_attention(&s);
    Py_END_ALLOW_THREADS
    if (status != ATTNC_OK) status_error(status, "attention");
done:
    if (PyErr_Occurred()) {
        Py_CLEAR(out);
        Py_CLEAR(weights);
    }
    Py_XDECREF(x);
    mask_release(&mask);
    return pack_result(out, weights);
}

/* ======================================================================== */
/* threads and kernel selection                                             */

static PyObject *py_set_num_threads(PyObject *self, PyObject *arg)
{
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 1 || n > 1024) return PyErr_Format(PyExc_ValueError, "n: expected 1 <= n <= 1024, got %ld", n);
    attnc_set_num_threads((int)n);
    Py_RETURN_NONE;
}

static PyObject *py_get_num_threads(PyObject *self, PyObject *unused)
{
    return PyLong_FromLong(attnc_get_num_threads());
}

static PyObject *py_set_simd(PyObject *self, PyObject *arg)
{
    int enabled = PyObject_IsTrue(arg);
    if (enabled < 0) return NULL;
    attnc_set_simd(enabled);
    Py_RETURN_NONE;
}

static PyObject *py_simd_active(PyObject *self, PyObject *unused) { return PyBool_FromLong(attnc_simd_active()); }

/* The ISA levels' names, indexed by level (attnc.h). */
static const char *const simd_level_names[] = {"portable", "avx2", "avx512"};
#define N_SIMD_LEVELS ((int)(sizeof(simd_level_names) / sizeof(simd_level_names[0])))

static PyObject *py_set_simd_level(PyObject *self, PyObject *arg)
{
    const char *name = PyUnicode_Check(arg) ? PyUnicode_AsUTF8(arg) : NULL;
    if (!name && PyErr_Occurred()) return NULL;
    for (int level = 0; name && level < N_SIMD_LEVELS; level++)
        if (strcmp(name, simd_level_names[level]) == 0) {
            attnc_set_simd_level(level);
            Py_RETURN_NONE;
        }
    return PyErr_Format(PyExc_ValueError, "level: expected 'portable', 'avx2' or 'avx512', got %R", arg);
}

static PyObject *py_simd_level(PyObject *self, PyObject *unused)
{
    return PyUnicode_FromString(simd_level_names[attnc_simd_level()]);
}

static PyObject *py_cpu_has_avx512(PyObject *self, PyObject *unused)
{
    return PyBool_FromLong(attnc_cpu_has_avx512());
}

static PyObject *py_cpu_has_avx2_fma(PyObject *self, PyObject *unused)
{
    return PyBool_FromLong(attnc_cpu_has_avx2_fma());
}

static PyObject *py_fail_alloc_after(PyObject *self, PyObject *arg)
{
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    attnc_fail_alloc_after(n);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"linear", py_linear, METH_VARARGS, "linear(x, weight, bias, dtype) -> x @ weight.T + bias"},
    {"softmax", py_softmax, METH_VARARGS, "softmax(x, axis, dtype) -> stable softmax along axis"},
    {"dropout", py_dropout, METH_VARARGS, "dropout(x, p, seed, dtype) -> x * keep / (1 - p)"},
    {"scaled_dot_product_attention", py_sdpa, METH_VARARGS,
     "scaled_dot_product_attention(q, k, v, mask, dropout_p, is_causal, scale, seed, return_weights, dtype)"},
    {"self_attention", py_self_attention, METH_VARARGS,
     "self_attention(x, wq, bq, wk, bk, wv, bv, wo, bo, n_heads, heads_axis, scale, mask, dropout_p, seed, "
     "return_weights)"},
    {"set_num_threads", py_set_num_threads, METH_O, "set_num_threads(n)"},
    {"get_num_threads", py_get_num_threads, METH_NOARGS, "get_num_threads() -> int"},
    {"set_simd", py_set_simd, METH_O, "set_simd(enabled): False forces the portable kernels, True the best"},
    {"simd_active", py_simd_active, METH_NOARGS, "simd_active() -> bool: AVX2 or AVX-512 kernels in use"},
    {"set_simd_level", py_set_simd_level, METH_O,
     "set_simd_level(level): use at most 'portable', 'avx2' or 'avx512' kernels"},
    {"simd_level", py_simd_level, METH_NOARGS, "simd_level() -> str: the kernels in use ('portable', 'avx2', 'avx512')"},
    {"cpu_has_avx2_fma", py_cpu_has_avx2_fma, METH_NOARGS, "cpu_has_avx2_fma() -> bool"},
    {"cpu_has_avx512", py_cpu_has_avx512, METH_NOARGS, "cpu_has_avx512() -> bool: AVX-512 F, VL and DQ"},
    {"fail_alloc_after", py_fail_alloc_after, METH_O,
     "fail_alloc_after(n): testing hook; the (n+1)-th kernel allocation fails (n < 0: never)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "attnc._C", .m_doc = "attnc's C kernels", .m_size = -1, .m_methods = methods,
};

PyMODINIT_FUNC PyInit__C(void)
{
    import_array();
    return PyModule_Create(&module);
}
