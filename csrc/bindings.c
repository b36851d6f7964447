/* CPython + NumPy glue only, and the one place arguments are checked.
 *
 * Every function parses named arguments, validates each of them (types,
 * dtypes, shapes, broadcasting, probabilities, scale, axis, thread counts,
 * the rng), raising TypeError / ValueError whose message starts with the
 * argument's name; converts arrays (dtype, byte order, alignment,
 * contiguity) copying only what needs it; fills the kernel's argument
 * struct with plain pointers, sizes and element strides; and runs the
 * kernel with the GIL released and Ctrl-C polled. The kernels below trust
 * what they receive. Nothing here computes.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define PY_ARRAY_UNIQUE_SYMBOL ATTNC_ARRAY_API
#include <numpy/arrayobject.h>

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "attnc.h"

static PyObject *generator_type; /* numpy.random.Generator, looked up at import */
static PyObject *draw_seed_fn;   /* attnc._random.draw_seed, looked up on first use */

/* ======================================================================== */
/* running a kernel: GIL released, Ctrl-C polled                            */

typedef struct {
    PyThreadState *thread; /* this thread's state while the GIL is released */
} released_gil;

/* The interrupt hook (attnc.h): the kernels call it now and then on the
 * calling thread. It takes the GIL back, runs Python's signal handlers and
 * releases the GIL again; nonzero once a handler has raised (Ctrl-C:
 * KeyboardInterrupt), and the exception stays set for the caller. */
static int poll_signals(void *ctx)
{
    released_gil *gil = ctx;
    PyEval_RestoreThread(gil->thread);
    int stop = PyErr_CheckSignals() != 0 || PyErr_Occurred() != NULL;
    gil->thread = PyEval_SaveThread();
    return stop;
}

/* The error of a call that continued in a child forked from its Ctrl-C
 * poll (os.fork() in a signal handler): its result would miss the work of
 * the parent's pool workers. */
static void forked_mid_call(void)
{
    PyErr_SetString(PyExc_RuntimeError, "the process forked during this call (os.fork() in a signal handler "
                                        "run mid-call): this child lacks the call's worker threads; call it again");
}

/* The hook of a call that must run to its end (an optimizer's update of
 * a parameter: stopped midway, it would leave it half stepped): it never
 * stops it, and a Ctrl-C during it is raised when it returns. */
static int run_to_the_end(void *ctx) { return 0; }

/* status = call, with the GIL released and the interrupt hook `poll`
 * installed. */
#define RUN_KERNEL_POLLED_BY(status, call, poll)                  \
    do {                                                          \
        released_gil gil_ = {PyEval_SaveThread()};                \
        attnc_interrupt_hook hook_ = {(poll), &gil_};             \
        attnc_call call_;                                         \
        attnc_call_begin(&call_, &hook_);                         \
        (status) = (call);                                        \
        attnc_call_end(&call_);                                   \
        PyEval_RestoreThread(gil_.thread);                        \
        if (call_.forked && !PyErr_Occurred()) forked_mid_call(); \
    } while (0)
#define RUN_KERNEL(status, call) RUN_KERNEL_POLLED_BY(status, call, poll_signals)

/* After RUN_KERNEL: 1 on success; else 0 with an exception set. A signal
 * handler's exception (KeyboardInterrupt) wins over the status, even when
 * it was raised after the kernel's last poll. */
static int kernel_ok(attnc_status status, const char *function)
{
    if (PyErr_Occurred()) return 0;
    switch (status) {
    case ATTNC_OK:
        return 1;
    case ATTNC_ENOMEM:
        PyErr_Format(PyExc_MemoryError, "%s: out of memory for the workspace", function);
        return 0;
    case ATTNC_EOVERFLOW:
        PyErr_Format(PyExc_MemoryError, "%s: the workspace size overflows", function);
        return 0;
    case ATTNC_EINTR: /* the hook stops a call only with an exception set */
        PyErr_SetNone(PyExc_KeyboardInterrupt);
        return 0;
    }
    PyErr_Format(PyExc_SystemError, "%s: unknown kernel status %d", function, (int)status);
    return 0;
}

/* ======================================================================== */
/* scalar arguments                                                         */

/* Raises `type` with the formatted message; the error being raised, if
 * any, becomes its __cause__ (as `raise ... from error`). */
static void raise_from_current(PyObject *type, const char *format, ...)
{
    PyObject *cause_type, *cause, *traceback;
    PyErr_Fetch(&cause_type, &cause, &traceback);
    PyErr_NormalizeException(&cause_type, &cause, &traceback);
    if (cause && traceback) PyException_SetTraceback(cause, traceback);
    Py_XDECREF(cause_type);
    Py_XDECREF(traceback);
    va_list args;
    va_start(args, format);
    PyErr_FormatV(type, format, args);
    va_end(args);
    if (!cause) return;
    PyObject *raised_type, *raised, *raised_traceback;
    PyErr_Fetch(&raised_type, &raised, &raised_traceback);
    PyErr_NormalizeException(&raised_type, &raised, &raised_traceback);
    if (raised) PyException_SetCause(raised, cause); /* steals cause */
    else Py_DECREF(cause);
    PyErr_Restore(raised_type, raised, raised_traceback);
}

/* Replaces a TypeError, ValueError, OverflowError or RuntimeError (torch's,
 * for a tensor of several elements asked for its truth) being raised by
 * one of the same type whose message starts with `name` (the original
 * becomes its __cause__: raise_from_current). */
static void name_the_error(const char *name)
{
    PyObject *type = PyErr_Occurred(); /* borrowed */
    /* a MemoryError of any kind (NumPy's own takes other arguments) as a
     * plain one */
    PyObject *named = type == PyExc_TypeError || type == PyExc_ValueError || type == PyExc_RuntimeError ||
                              type == PyExc_OverflowError
                          ? type
                      : type && PyErr_GivenExceptionMatches(type, PyExc_MemoryError) ? PyExc_MemoryError
                                                                                    : NULL;
    if (!named) return;
    PyObject *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    Py_XINCREF(value); /* for the message, past the cause's restore below */
    PyErr_Restore(type, value, tb);
    raise_from_current(named, "%s: %S", name, value);
    Py_XDECREF(value);
}

/* 'b' when obj is a bool where a number or an integer belongs: Python's,
 * or anything of a bool dtype (NumPy's bool scalars and arrays, a torch
 * bool tensor), which convert to 0 and 1 as numbers do; scale=False where
 * the forward's order puts is_causal, or dropout=np.array(True), is a
 * slip, not a scale of 0 or a probability of 1. 'c' when it is complex
 * (NumPy's complex scalars and arrays, a torch complex tensor), whose
 * conversion to a float would drop the imaginary part with only a
 * warning. 'a' when it has axes (an `ndim` above 0): NumPy refuses such an
 * array as a number even of one element, and torch's float() takes a
 * tensor of one, so both are refused alike. Else 0; -1 with the error its
 * dtype or ndim raised (other than AttributeError: a property's own, a
 * KeyboardInterrupt). */
static int odd_number_kind(PyObject *obj)
{
    if (PyBool_Check(obj) || PyArray_IsScalar(obj, Bool)) return 'b';
    if (PyLong_CheckExact(obj) || PyFloat_CheckExact(obj)) return 0; /* the usual numbers, at once */
    if (PyComplex_Check(obj) || PyArray_IsScalar(obj, ComplexFloating)) return 'c';
    PyObject *dtype = PyObject_GetAttrString(obj, "dtype");
    if (!dtype) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return -1; /* its own (a property's, Ctrl-C) */
        PyErr_Clear(); /* no dtype: neither (the conversion names what it is) */
        return 0;
    }
    int kind = 0;
    if (PyArray_DescrCheck(dtype)) {
        char k = ((PyArray_Descr *)dtype)->kind;
        kind = k == 'b' || k == 'c' ? k : 0;
    } else {
        PyObject *text = PyObject_Str(dtype);
        const char *name = text && PyUnicode_Check(text) ? PyUnicode_AsUTF8(text) : NULL;
        if (name && strcmp(name, "torch.bool") == 0) kind = 'b';
        else if (name && strncmp(name, "torch.complex", strlen("torch.complex")) == 0) kind = 'c';
        else if (PyErr_Occurred()) kind = -1; /* str() of it raised */
        Py_XDECREF(text);
    }
    Py_DECREF(dtype);
    if (kind) return kind;
    PyObject *ndim = PyObject_GetAttrString(obj, "ndim");
    if (!ndim) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return -1;
        PyErr_Clear();
        return 0;
    }
    long axes = PyLong_Check(ndim) ? PyLong_AsLong(ndim) : 0;
    Py_DECREF(ndim);
    if (axes == -1 && PyErr_Occurred()) return -1;
    return axes > 0 ? 'a' : 0;
}

/* obj as a double: Python and NumPy numbers, not strings, bools or complex
 * numbers (odd_number_kind). TypeError naming `name` (expected `what`)
 * otherwise; an int beyond the float range is a ValueError; another
 * error of the conversion (a torch tensor's RuntimeError) is named. */
static int as_double(PyObject *obj, const char *name, const char *what, double *out)
{
    int kind = PyUnicode_Check(obj) || PyBytes_Check(obj) ? 's' /* text: refused */ : odd_number_kind(obj);
    if (kind < 0) {
        name_the_error(name);
        return 0;
    }
    if (!kind) {
        *out = PyFloat_AsDouble(obj);
        if (!(*out == -1.0 && PyErr_Occurred())) return 1;
        if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
            raise_from_current(PyExc_ValueError, "%s: expected %s, got an integer too large for a float", name, what);
            return 0;
        }
        if (!PyErr_ExceptionMatches(PyExc_TypeError) && !PyErr_ExceptionMatches(PyExc_ValueError)) {
            name_the_error(name);
            return 0;
        }
    }
    raise_from_current(PyExc_TypeError, "%s: expected %s, got %R", name, what, obj); /* __float__'s error its cause */
    return 0;
}

/* *out <- bool(obj), Python's truth of it, when obj is given (else the
 * default stays); an object that has none (an array of several elements)
 * raises its error, named (name_the_error). */
static int flag_argument(PyObject *obj, const char *name, int *out)
{
    if (!obj) return 1;
    int truth = PyObject_IsTrue(obj);
    if (truth < 0) {
        name_the_error(name);
        return 0;
    }
    *out = truth;
    return 1;
}

/* A dropout probability: a number in [0, 1] (NaN is not). */
static int probability(PyObject *obj, const char *name, double *p)
{
    if (!as_double(obj, name, "a number in [0, 1]", p)) return 0;
    if (*p >= 0.0 && *p <= 1.0) return 1;
    PyErr_Format(PyExc_ValueError, "%s: expected a probability in [0, 1], got %R", name, obj);
    return 0;
}

static int finite_number(PyObject *obj, const char *name, double *out)
{
    if (!as_double(obj, name, "a finite number", out)) return 0;
    if (isfinite(*out)) return 1;
    PyErr_Format(PyExc_ValueError, "%s: expected a finite number, got %R", name, obj);
    return 0;
}

/* An attention scale that the reals of dtype dt's kernels hold as it is: 0
 * or normal. Every dtype but float64 computes in float32, where a scale
 * beyond FLT_MAX would be inf (every score 0 * inf = NaN) and one below
 * FLT_MIN subnormal or 0 (1e-60 made every weight uniform where torch,
 * multiplying q and k by its square root, gave the scores of 1e30-sized
 * rows); float64's reals likewise below DBL_MIN. */
static int scale_fits(double scale, attnc_dtype dt)
{
    int wide = dt == ATTNC_F64;
    if (scale == 0 || (wide ? fabs(scale) >= DBL_MIN : isnormal((float)scale))) return 1;
    char message[192]; /* (PyErr_Format has no %g) */
    if (wide)
        snprintf(message, sizeof message, "scale: expected 0 or a normal float64 (magnitude at least %g), got %g",
                 DBL_MIN, scale);
    else
        snprintf(message, sizeof message, "scale: expected 0 or a number that is normal in float32 (magnitude %g "
                 "to %g; the compute dtype of float32, float16 and bfloat16), got %g", FLT_MIN, FLT_MAX, scale);
    PyErr_SetString(PyExc_ValueError, message);
    return 0;
}

/* obj through __index__ (a new reference), or NULL with TypeError naming
 * `name` for what __index__ refuses, and for a bool (odd_number_kind: True
 * where a count, an axis or a seed belongs is a slip) or an array with axes
 * (as NumPy refuses it); __index__'s other errors as raised. */
static PyObject *integer_of(PyObject *obj, const char *name)
{
    int kind = odd_number_kind(obj);
    PyObject *index = kind ? NULL : PyNumber_Index(obj);
    if (!index && !(PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_TypeError)))
        raise_from_current(PyExc_TypeError, "%s: expected an integer, got %s", name, Py_TYPE(obj)->tp_name);
    return index;
}

/* obj as a C long (integer_of); *overflow as PyLong_AsLongAndOverflow. */
static int as_long(PyObject *obj, const char *name, long *out, int *overflow)
{
    PyObject *index = integer_of(obj, name);
    if (!index) return 0;
    *out = PyLong_AsLongAndOverflow(index, overflow);
    Py_DECREF(index);
    return !(*out == -1 && PyErr_Occurred());
}

/* Whether obj is a tuple (the module calls' params, spec and saved). */
static int tuple_argument(PyObject *obj, const char *name)
{
    if (PyTuple_Check(obj)) return 1;
    PyErr_Format(PyExc_TypeError, "%s: expected a tuple, got %s", name, Py_TYPE(obj)->tp_name);
    return 0;
}

static int check_rng(PyObject *rng)
{
    if (rng == Py_None || Py_IS_TYPE(rng, (PyTypeObject *)generator_type)) return 1;
    int is_generator = PyObject_IsInstance(rng, generator_type);
    if (is_generator) return is_generator > 0;
    PyErr_Format(PyExc_TypeError, "rng: expected a numpy.random.Generator or None, got %s", Py_TYPE(rng)->tp_name);
    return 0;
}

/* A fresh key for one dropout mask, drawn from rng (None: the package's
 * global generator) by attnc._random.draw_seed. Called only when dropout
 * applies, so a call without dropout leaves the generator untouched. */
static int draw_seed(PyObject *rng, uint64_t *seed)
{
    if (!draw_seed_fn) {
        PyObject *random = PyImport_ImportModule("attnc._random");
        if (!random) return 0;
        draw_seed_fn = PyObject_GetAttrString(random, "draw_seed");
        Py_DECREF(random);
        if (!draw_seed_fn) return 0;
    }
    PyObject *value = PyObject_CallOneArg(draw_seed_fn, rng);
    if (!value) return 0;
    unsigned long long key = PyLong_AsUnsignedLongLong(value);
    Py_DECREF(value);
    if (key == (unsigned long long)-1 && PyErr_Occurred()) return 0;
    *seed = key;
    return 1;
}

/* A dropout mask's key given by the caller: None (leave *seed: one is
 * drawn), or an integer in [0, 2**64). */
static int seed_argument(PyObject *obj, uint64_t *seed)
{
    if (obj == Py_None) return 1;
    PyObject *index = integer_of(obj, "seed");
    if (!index) return 0;
    unsigned long long key = PyLong_AsUnsignedLongLong(index);
    Py_DECREF(index);
    if (key == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "seed: expected an integer in [0, 2**64), got %R", obj);
        return 0;
    }
    *seed = key;
    return 1;
}

/* ======================================================================== */
/* arrays                                                                   */

/* ml_dtypes' bfloat16 descriptor (borrowed, kept for the process), or
 * NULL with no exception while ml_dtypes is not imported: an array or a
 * dtype of it cannot exist before, so attnc never imports it itself. */
static PyArray_Descr *bfloat16_descr(void)
{
    static PyArray_Descr *descr = NULL; /* set once, under the GIL */
    if (descr) return descr;
    PyObject *name = PyUnicode_FromString("ml_dtypes");
    PyObject *module = name ? PyImport_GetModule(name) : NULL;
    PyObject *type = module ? PyObject_GetAttrString(module, "bfloat16") : NULL;
    PyArray_Descr *found = NULL;
    if (type && PyArray_DescrConverter(type, &found) && PyDataType_ELSIZE(found) == 2) descr = found;
    else Py_XDECREF(found);
    Py_XDECREF(type);
    Py_XDECREF(module);
    Py_XDECREF(name);
    PyErr_Clear();
    return descr;
}

/* ml_dtypes' types are of kind 'V': only those ask for ml_dtypes (a
 * lookup of sys.modules until it is imported), never a float or an int. */
static int is_bfloat16(const PyArray_Descr *d)
{
    const PyArray_Descr *bf16 = d->kind == 'V' ? bfloat16_descr() : NULL;
    return bf16 && d->type_num == bf16->type_num;
}

/* A new reference to dt's descriptor (NULL with TypeError for bfloat16
 * without ml_dtypes). */
static PyArray_Descr *dtype_descr(attnc_dtype dt)
{
    static const int builtin[] = {[ATTNC_F32] = NPY_FLOAT, [ATTNC_F64] = NPY_DOUBLE, [ATTNC_F16] = NPY_HALF};
    if (dt != ATTNC_BF16) return PyArray_DescrFromType(builtin[dt]);
    PyArray_Descr *bf16 = bfloat16_descr();
    if (!bf16) PyErr_SetString(PyExc_TypeError, "bfloat16 needs the ml_dtypes package: pip install ml_dtypes");
    Py_XINCREF(bf16);
    return bf16;
}

/* 1 if arr's elements are dt's, in either byte order. */
static int holds_dtype(PyArrayObject *arr, attnc_dtype dt)
{
    PyArray_Descr *descr = dtype_descr(dt);
    if (!descr) {
        PyErr_Clear();
        return 0;
    }
    int same = PyArray_DESCR(arr)->type_num == descr->type_num;
    Py_DECREF(descr);
    return same;
}

/* 1 if arr's elements are dt's, in native byte order. */
static int has_dtype(PyArrayObject *arr, attnc_dtype dt) { return holds_dtype(arr, dt) && PyArray_ISNOTSWAPPED(arr); }

/* The dtype lse and other compute-precision results come in: float for
 * the 16-bit dtypes. */
static attnc_dtype compute_dtype(attnc_dtype dt) { return dt == ATTNC_F64 ? ATTNC_F64 : ATTNC_F32; }

/* A shape as a tuple, for messages (NULL with an exception on failure). */
static PyObject *shape_tuple(int nd, const npy_intp *dims)
{
    PyObject *shape = PyTuple_New(nd);
    for (int d = 0; shape && d < nd; d++) {
        PyObject *size = PyLong_FromSsize_t(dims[d]);
        if (!size) Py_CLEAR(shape);
        else PyTuple_SET_ITEM(shape, d, size);
    }
    return shape;
}

/* ValueError "name: expected shape (a, b), got (c,)". */
static void shape_error(const char *name, int expected_nd, const npy_intp *expected, PyArrayObject *arr)
{
    PyObject *want = shape_tuple(expected_nd, expected);
    PyObject *got = want ? shape_tuple(PyArray_NDIM(arr), PyArray_DIMS(arr)) : NULL;
    if (got) PyErr_Format(PyExc_ValueError, "%s: expected shape %R, got %R", name, want, got);
    Py_XDECREF(want);
    Py_XDECREF(got);
}

/* 1 if obj's `dtype` reads "torch.bfloat16", 0 if not (or obj has no
 * dtype), -1 with an exception. */
static int is_torch_bfloat16(PyObject *obj)
{
    PyObject *dtype = PyObject_GetAttrString(obj, "dtype");
    if (!dtype) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return -1;
        PyErr_Clear();
        return 0;
    }
    PyObject *dtype_name = PyObject_Str(dtype);
    Py_DECREF(dtype);
    if (!dtype_name) return -1;
    int bfloat = PyUnicode_CompareWithASCIIString(dtype_name, "torch.bfloat16") == 0;
    Py_DECREF(dtype_name);
    return bfloat;
}

/* A torch tensor as NumPy's conversion takes it (torch's: an object with a
 * `requires_grad`): detached where it requires grad (NumPy refuses it, and
 * attnc never differentiates through it), widened to float32 where it is
 * bfloat16 (NumPy refuses torch's bfloat16; the widening is exact, as
 * from_torch's). Anything else as it is. A new reference, or NULL with an
 * exception. */
static PyObject *as_numpy_convertible(PyObject *obj)
{
    Py_INCREF(obj);
    if (PyArray_Check(obj) || !PyObject_HasAttrString(obj, "requires_grad")) return obj;
    PyObject *flag = PyObject_GetAttrString(obj, "requires_grad");
    int requires = flag ? PyObject_IsTrue(flag) : -1;
    Py_XDECREF(flag);
    if (requires > 0) Py_SETREF(obj, PyObject_CallMethod(obj, "detach", NULL));
    int bfloat = requires >= 0 && obj ? is_torch_bfloat16(obj) : -1;
    if (bfloat > 0) Py_SETREF(obj, PyObject_CallMethod(obj, "float", NULL));
    if (bfloat < 0) Py_CLEAR(obj);
    return obj;
}

/* Whether obj is a numpy.ma.MaskedArray with an element masked: attnc
 * reads every element's value, masked or not, so it refuses such an array
 * (ValueError naming `name`) rather than compute with the values under its
 * mask. 1 with that error, -1 with another, 0 otherwise (a masked array
 * with nothing masked is read as its data). numpy.ma is looked up only if
 * imported: before, no masked array exists. */
static int has_masked_elements(PyObject *obj, const char *name)
{
    if (!PyArray_Check(obj) || PyArray_CheckExact(obj)) return 0;
    PyObject *ma_name = PyUnicode_FromString("numpy.ma");
    PyObject *ma = ma_name ? PyImport_GetModule(ma_name) : NULL;
    Py_XDECREF(ma_name);
    if (!ma) return PyErr_Occurred() ? -1 : 0;
    PyObject *cls = PyObject_GetAttrString(ma, "MaskedArray");
    int is_masked_array = cls ? PyObject_IsInstance(obj, cls) : -1, masked = 0;
    Py_XDECREF(cls);
    if (is_masked_array > 0) {
        PyObject *any = PyObject_CallMethod(ma, "is_masked", "O", obj);
        masked = any ? PyObject_IsTrue(any) : -1;
        Py_XDECREF(any);
    }
    Py_DECREF(ma);
    if (is_masked_array < 0 || masked < 0) return -1;
    if (masked)
        PyErr_Format(PyExc_ValueError,
                     "%s: a masked array with masked elements; attnc reads every element, masked or not: "
                     "pass %s.filled(value)", name, name);
    return masked;
}

/* obj as an ndarray of real numbers (obj itself for an ndarray): bool,
 * integers and floats: NumPy's, and those of other packages that NumPy
 * casts to float32 safely (bfloat16, and ml_dtypes' float8 and narrower,
 * of kind 'V' but float8_e5m2's 'f'); TypeError naming `name` for complex,
 * object, strings, void, datetimes. A new reference. */
static PyArrayObject *real_values(PyObject *obj, const char *name)
{
    int masked = has_masked_elements(obj, name);
    if (masked) {
        if (masked < 0) name_the_error(name);
        return NULL;
    }
    PyObject *value = as_numpy_convertible(obj);
    PyArrayObject *arr = value ? (PyArrayObject *)PyArray_FROM_O(value) : NULL;
    Py_XDECREF(value);
    if (!arr) {
        name_the_error(name);
        return NULL;
    }
    PyArray_Descr *descr = PyArray_DESCR(arr), *single = PyArray_DescrFromType(NPY_FLOAT);
    char kind = descr->kind;
    int real = kind == 'b' || kind == 'i' || kind == 'u' || kind == 'f' ||
               (kind == 'V' && PyArray_CanCastTypeTo(descr, single, NPY_SAFE_CASTING));
    Py_DECREF(single);
    if (real) return arr;
    PyErr_Format(PyExc_TypeError, "%s: unsupported dtype %R; expected real numbers (bool, int or float)", name,
                 (PyObject *)PyArray_DESCR(arr));
    Py_DECREF(arr);
    return NULL;
}

/* real_values as a view of its own: the call's shapes and strides are read
 * from an object nobody else holds, which Python code run by a later
 * argument's conversion (a mask's __array__, a window side's __index__)
 * cannot reshape, whether the array is the argument or one its __array__
 * returned. No copy. A new reference. */
static PyArrayObject *real_array(PyObject *obj, const char *name)
{
    PyArrayObject *arr = real_values(obj, name);
    if (arr) Py_SETREF(arr, (PyArrayObject *)PyArray_View(arr, NULL, &PyArray_Type));
    return arr;
}

/* The functional layer's result dtype: the narrowest of float16,
 * bfloat16, float32 and float64 that holds every input's values (in any
 * byte order); integers and bools count as float32, and float16 with
 * bfloat16 gives float32 (neither holds the other). NULL entries are
 * skipped. */
static attnc_dtype result_dtype(PyArrayObject *const *arrays, int n)
{
    int wide = 0, single = 0, half = 0, bfloat = 0;
    for (int i = 0; i < n; i++) {
        if (!arrays[i]) continue;
        int is_float = PyArray_DESCR(arrays[i])->kind == 'f', size = (int)PyArray_ITEMSIZE(arrays[i]);
        if (is_bfloat16(PyArray_DESCR(arrays[i]))) bfloat = 1;
        else if (is_float && size >= 8) wide = 1;
        else if (is_float && size == 2) half = 1;
        else single = 1;
    }
    if (wide) return ATTNC_F64;
    if (single || (half && bfloat) || !(half || bfloat)) return ATTNC_F32;
    return half ? ATTNC_F16 : ATTNC_BF16;
}

/* A view of arr's memory from `data`, of shape `dims` and arr's dtype and
 * strides, writable with `writable` (if arr is), its base arr (a new
 * reference; NULL on failure). */
static PyArrayObject *view_of(PyArrayObject *arr, const npy_intp *dims, char *data, int writable)
{
    PyArray_Descr *descr = PyArray_DESCR(arr);
    Py_INCREF(descr);
    PyArrayObject *view = (PyArrayObject *)PyArray_NewFromDescr(
        &PyArray_Type, descr, PyArray_NDIM(arr), (npy_intp *)dims, PyArray_STRIDES(arr), data,
        writable ? NPY_ARRAY_WRITEABLE & PyArray_FLAGS(arr) : 0, NULL);
    Py_INCREF(arr);
    if (view && PyArray_SetBaseObject(view, (PyObject *)arr) < 0) { /* steals arr */
        Py_DECREF(view);
        return NULL;
    }
    if (!view) Py_DECREF(arr);
    return view;
}

/* A view of rows [first, end) of arr along `axis` (writable if arr is). */
static PyArrayObject *rows_view(PyArrayObject *arr, int axis, npy_intp first, npy_intp end)
{
    npy_intp dims[NPY_MAXDIMS];
    for (int d = 0; d < PyArray_NDIM(arr); d++) dims[d] = PyArray_DIM(arr, d);
    dims[axis] = end - first;
    return view_of(arr, dims, PyArray_BYTES(arr) + first * PyArray_STRIDE(arr, axis), 1);
}

/* dst <- src (the same shape), a block of COPY_BLOCK_BYTES of dst at a time
 * along its first axis longer than 1 (its whole rows of the axes after it),
 * polling for Ctrl-C between blocks: NumPy's own copy polls nothing (a
 * transposed (8192, 8192) float32 input took 0.4 s to convert, Ctrl-C
 * waiting for all of it). The blocks were 8 MB: into fresh pages, on a host
 * slow to give them, one took up to 0.22 s (1 MB: 0.027 s; the whole copy
 * as fast, 2026-12-07). 0 with an exception set on failure. */
#define COPY_BLOCK_BYTES (1024 * 1024)
static int copy_into_polling(PyArrayObject *dst, PyArrayObject *src)
{
    int nd = PyArray_NDIM(dst), axis = 0;
    if (nd == 0 || PyArray_SIZE(dst) == 0) return PyArray_CopyInto(dst, src) == 0;
    while (axis < nd - 1 && PyArray_DIM(dst, axis) == 1) axis++;
    npy_intp n = PyArray_DIM(dst, axis), row_bytes = PyArray_NBYTES(dst) / n;
    npy_intp block = row_bytes < COPY_BLOCK_BYTES ? COPY_BLOCK_BYTES / row_bytes : 1;
    for (npy_intp first = 0; first < n; first += block) {
        npy_intp end = n - first < block ? n : first + block;
        PyArrayObject *from = rows_view(src, axis, first, end), *to = from ? rows_view(dst, axis, first, end) : NULL;
        int failed = !to || PyArray_CopyInto(to, from) < 0 || PyErr_CheckSignals() < 0;
        Py_XDECREF(from);
        Py_XDECREF(to);
        if (failed) return 0;
    }
    return 1;
}

/* Whether NumPy's FromAny(arr, descr, flags) gives arr itself (or a view of
 * it) for these flags of copy_as's callers. */
static int fits_as_is(PyArrayObject *arr, PyArray_Descr *descr, int flags)
{
    return !(flags & NPY_ARRAY_ENSURECOPY) && PyArray_EquivTypes(PyArray_DESCR(arr), descr) &&
           PyArray_ISALIGNED(arr) && PyArray_ISNOTSWAPPED(arr) &&
           (!(flags & NPY_ARRAY_C_CONTIGUOUS) || PyArray_IS_C_CONTIGUOUS(arr)) &&
           (!(flags & NPY_ARRAY_WRITEABLE) || PyArray_ISWRITEABLE(arr));
}

/* What NumPy's FromAny(arr, descr (stolen), flags) gives, its copy of more
 * than COPY_BLOCK_BYTES made by copy_into_polling instead (a C-contiguous
 * base-class array). */
static PyArrayObject *copy_as(PyArrayObject *arr, PyArray_Descr *descr, int flags)
{
    idx_t bytes; /* (an overflowing size: FromAny's error) */
    if (fits_as_is(arr, descr, flags) || !attnc_mul_ok(PyArray_SIZE(arr), PyDataType_ELSIZE(descr), &bytes) ||
        bytes <= COPY_BLOCK_BYTES)
        return (PyArrayObject *)PyArray_FromAny((PyObject *)arr, descr, 0, 0, flags, NULL);
    PyArrayObject *out = (PyArrayObject *)PyArray_NewFromDescr(&PyArray_Type, descr, PyArray_NDIM(arr),
                                                               PyArray_DIMS(arr), NULL, NULL, 0, NULL);
    if (out && !copy_into_polling(out, arr)) Py_CLEAR(out);
    return out;
}

/* arr as an aligned, native-byte-order base-class array of descr (stolen;
 * a new reference); C-contiguous too with `contiguous`. Copies only if
 * needed (copy_as). */
static PyArrayObject *cast(PyArrayObject *arr, PyArray_Descr *descr, int contiguous)
{
    return copy_as(arr, descr,
                   NPY_ARRAY_ALIGNED | NPY_ARRAY_NOTSWAPPED | NPY_ARRAY_FORCECAST |
                       (contiguous ? NPY_ARRAY_C_CONTIGUOUS : 0));
}

/* cast() of a score bias to descr (stolen): a value beyond the dtype's
 * range (float32's -1e9 into float16) becomes -inf, the key hidden, by
 * design, so where the cast narrows NumPy's overflow warning (an error
 * under np.seterr(over="raise")) is silenced around it, as
 * numpy.errstate(over="ignore") does. */
static PyArrayObject *cast_bias(PyArrayObject *arr, PyArray_Descr *descr)
{
    if (PyArray_ITEMSIZE(arr) <= PyDataType_ELSIZE(descr)) return cast(arr, descr, 0);
    PyObject *numpy = PyImport_ImportModule("numpy");
    PyObject *errstate = numpy ? PyObject_GetAttrString(numpy, "errstate") : NULL;
    PyObject *no_args = errstate ? PyTuple_New(0) : NULL;
    PyObject *kwargs = no_args ? Py_BuildValue("{s:s}", "over", "ignore") : NULL;
    PyObject *quiet = kwargs ? PyObject_Call(errstate, no_args, kwargs) : NULL;
    PyObject *entered = quiet ? PyObject_CallMethod(quiet, "__enter__", NULL) : NULL;
    Py_XDECREF(numpy);
    Py_XDECREF(errstate);
    Py_XDECREF(no_args);
    Py_XDECREF(kwargs);
    if (!entered) {
        Py_XDECREF(quiet);
        Py_DECREF(descr);
        return NULL;
    }
    Py_DECREF(entered);
    PyArrayObject *out = cast(arr, descr, 0);
    PyObject *type, *value, *traceback; /* the cast's error, kept across __exit__ */
    PyErr_Fetch(&type, &value, &traceback);
    PyObject *exited = PyObject_CallMethod(quiet, "__exit__", "OOO", Py_None, Py_None, Py_None);
    Py_DECREF(quiet);
    if (!exited) {
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(traceback);
        Py_XDECREF(out);
        return NULL;
    }
    Py_DECREF(exited);
    PyErr_Restore(type, value, traceback);
    return out;
}

/* arr cast (above) to the kernels' dtype dt. */
static PyArrayObject *convert(PyArrayObject *arr, attnc_dtype dt, int contiguous)
{
    PyArray_Descr *descr = dtype_descr(dt);
    return descr ? cast(arr, descr, contiguous) : NULL;
}

/* Replaces *arr, the argument `name`, by its conversion (see convert); 0
 * on failure (*arr NULL), the error named (a broadcast view too large to
 * copy: MemoryError). */
static int convert_in_place(PyArrayObject **arr, attnc_dtype dt, int contiguous, const char *name)
{
    PyArrayObject *converted = convert(*arr, dt, contiguous);
    Py_DECREF(*arr);
    *arr = converted;
    if (!converted) name_the_error(name);
    return converted != NULL;
}

/* A view of arr with each axis of stride 0 (a broadcast, one element
 * repeated along it) cut to length 1, but the last unless `cut_last`, or
 * arr itself (a new reference either way; NULL on failure). An empty array
 * keeps its shape: any strides are legal for it (NumPy never reads it), and
 * cutting its empty axis would make it non-empty. */
static PyArrayObject *repeats_cut(PyArrayObject *arr, int cut_last)
{
    int nd = PyArray_NDIM(arr), cut = 0;
    npy_intp dims[NPY_MAXDIMS];
    for (int d = 0; d < nd; d++) {
        dims[d] = PyArray_DIM(arr, d);
        if ((cut_last || d < nd - 1) && PyArray_STRIDE(arr, d) == 0 && dims[d] > 1 && PyArray_SIZE(arr) > 0) {
            dims[d] = 1;
            cut = 1;
        }
    }
    if (!cut) {
        Py_INCREF(arr);
        return arr;
    }
    return view_of(arr, dims, PyArray_BYTES(arr), 0);
}

/* Whether arr, written out in dt, would fit in this machine's memory (1 if
 * the memory is unknown); MemoryError if not. */
static int fits_in_memory(PyArrayObject *arr, attnc_dtype dt)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    double bytes = (double)PyArray_SIZE(arr) * (double)attnc_dtype_size(dt), memory = (double)pages * (double)page;
    if (pages <= 0 || page <= 0 || bytes <= memory) return 1;
    char message[160]; /* (PyErr_Format has no %g) */
    snprintf(message, sizeof message, "a broadcast of %.3g GiB in the call's dtype, more than this machine's memory "
             "(%.3g GiB)", bytes / (1 << 30), memory / (1 << 30));
    PyErr_SetString(PyExc_MemoryError, message);
    return 0;
}

/* As convert_in_place, and the last axis has unit stride (each row is a
 * plain vector; the other axes keep their strides). A broadcast stays
 * one: its repeated rows or items are converted once and read in place
 * (stride 0), and a repeated last axis is written out for one row. Where
 * that took a copy, a broadcast larger than the machine's memory (written
 * out) raises MemoryError, as the copy of the whole of it did; before, a
 * key of np.broadcast_to(np.float32(1), (2**26, 64)) was copied whole, 16
 * GiB, and the process was killed out of memory. */
static int row_major_in_place(PyArrayObject **arr, attnc_dtype dt, const char *name)
{
    PyArrayObject *full = *arr, *rows = repeats_cut(full, 0);
    int cut = rows != full, copied = 0, named = 0;
    *arr = rows;
    if (rows) {
        Py_INCREF(rows);
        if (convert_in_place(arr, dt, 0, name))
            copied = *arr != rows;
        else
            named = 1;
        Py_DECREF(rows);
    }
    int nd = *arr ? PyArray_NDIM(*arr) : 0;
    if (*arr && nd > 0 && PyArray_DIM(*arr, nd - 1) > 1 && PyArray_STRIDE(*arr, nd - 1) != PyArray_ITEMSIZE(*arr)) {
        Py_SETREF(*arr, convert(*arr, dt, 1));
        copied = 1;
    }
    if (*arr && cut && copied && !fits_in_memory(full, dt)) Py_CLEAR(*arr);
    if (*arr && cut) { /* back to the full shape: stride 0 on the cut axes */
        npy_intp strides[NPY_MAXDIMS];
        for (int d = 0; d < nd; d++)
            strides[d] = PyArray_DIM(*arr, d) == PyArray_DIM(full, d) ? PyArray_STRIDE(*arr, d) : 0;
        PyArray_Descr *descr = PyArray_DESCR(*arr);
        Py_INCREF(descr);
        PyArrayObject *view = (PyArrayObject *)PyArray_NewFromDescr(&PyArray_Type, descr, nd, PyArray_DIMS(full),
                                                                    strides, PyArray_DATA(*arr), 0, NULL);
        if (view && PyArray_SetBaseObject(view, (PyObject *)*arr) < 0) /* steals *arr */
            Py_CLEAR(view);
        else if (!view)
            Py_DECREF(*arr);
        *arr = view;
    }
    Py_DECREF(full);
    if (!*arr && !named) name_the_error(name);
    return *arr != NULL;
}

/* real_array then convert: an input of a known dtype. */
static PyArrayObject *real_input(PyObject *obj, const char *name, attnc_dtype dt, int contiguous)
{
    PyArrayObject *arr = real_array(obj, name);
    if (arr && !convert_in_place(&arr, dt, contiguous, name)) return NULL;
    return arr;
}

/* The `dtype` argument of linear/softmax/dropout (a module's dtype): None
 * (the functional rule), float16, bfloat16, float32 or float64. 0 with
 * TypeError otherwise. */
static int dtype_argument(PyObject *obj, int *given, attnc_dtype *dt)
{
    *given = obj != NULL && obj != Py_None;
    if (!*given) return 1;
    PyArray_Descr *descr = NULL;
    if (!PyArray_DescrConverter(obj, &descr)) {
        name_the_error("dtype");
        return 0;
    }
    int type = descr->type_num, bfloat = is_bfloat16(descr);
    Py_DECREF(descr);
    if (type == NPY_FLOAT || type == NPY_DOUBLE || type == NPY_HALF || bfloat) {
        *dt = bfloat ? ATTNC_BF16 : type == NPY_HALF ? ATTNC_F16 : type == NPY_FLOAT ? ATTNC_F32 : ATTNC_F64;
        return 1;
    }
    PyErr_Format(PyExc_TypeError, "dtype: expected float16, bfloat16, float32 or float64, got %R", obj);
    return 0;
}

static idx_t elem_stride(PyArrayObject *arr, int axis)
{
    return PyArray_STRIDE(arr, axis) / PyArray_ITEMSIZE(arr);
}

/* NumPy's allocator for the arrays attnc returns of ATTNC_KEPT_MIN_BYTES or
 * more: alloc.c's, whose freed large blocks the next call's arrays and
 * buffers reuse. From the C library, each new array of that size came in
 * fresh pages that the system zeroed as they were touched (an array it
 * freed was given back to it): a training step of MultiHeadAttention(768,
 * 12) on x (4, 128, 768) spent about a fifth of its time so
 * (benchmarks/NOTES.md). */
static void *kept_malloc(void *ctx, size_t size)
{
    (void)ctx;
    return attnc_malloc(size);
}

static void *kept_calloc(void *ctx, size_t nelem, size_t elsize)
{
    (void)ctx;
    idx_t size;
    if (nelem > PTRDIFF_MAX || elsize > PTRDIFF_MAX || !attnc_mul_ok((idx_t)nelem, (idx_t)elsize, &size)) return NULL;
    void *p = attnc_malloc((size_t)size);
    if (p) memset(p, 0, (size_t)size);
    return p;
}

static void *kept_realloc(void *ctx, void *p, size_t size)
{
    (void)ctx;
    return attnc_realloc(p, size);
}

static void kept_free(void *ctx, void *p, size_t size)
{
    (void)ctx, (void)size;
    attnc_free(p);
}

static PyDataMem_Handler kept_blocks_handler = {
    "attnc_kept_blocks", 1, {NULL, kept_malloc, kept_calloc, kept_realloc, kept_free},
};
static PyObject *kept_blocks_capsule; /* the handler as NumPy takes it (module init) */

/* A new C-contiguous array of dt, zero-filled when `zeros`. */
static PyObject *new_array_of(int nd, const npy_intp *shape, attnc_dtype dt, int zeros)
{
    PyArray_Descr *descr = dtype_descr(dt); /* stolen by both */
    if (!descr) return NULL;
    npy_intp elems = PyArray_OverflowMultiplyList((npy_intp *)shape, nd); /* -1: overflows, NumPy's error below */
    PyObject *previous = NULL; /* NumPy's handler, while attnc's is set */
    if (elems >= 0 && (size_t)elems >= ATTNC_KEPT_MIN_BYTES / attnc_dtype_size(dt) &&
        !(previous = PyDataMem_SetHandler(kept_blocks_capsule))) {
        Py_DECREF(descr);
        return NULL;
    }
    PyObject *arr = zeros ? PyArray_Zeros(nd, (npy_intp *)shape, descr, 0)
                          : PyArray_NewFromDescr(&PyArray_Type, descr, nd, (npy_intp *)shape, NULL, NULL, 0, NULL);
    if (previous) { /* (restoring fails only as a context variable's set does: MemoryError) */
        PyObject *ours = PyDataMem_SetHandler(previous);
        Py_DECREF(previous);
        if (!ours) Py_CLEAR(arr);
        Py_XDECREF(ours);
    }
    return arr;
}

static PyObject *new_array(int nd, const npy_intp *shape, attnc_dtype dt) { return new_array_of(nd, shape, dt, 0); }

/* result, or (NULL) its error named after the argument that asked for it */
static PyObject *named(PyObject *result, const char *name)
{
    if (!result) name_the_error(name);
    return result;
}

static int check_min_ndim(PyArrayObject *arr, const char *name, int min_nd, const char *layout)
{
    if (PyArray_NDIM(arr) >= min_nd) return 1;
    PyErr_Format(PyExc_ValueError, "%s: expected at least %d dimension%s %s, got %d", name, min_nd,
                 min_nd == 1 ? "" : "s", layout, PyArray_NDIM(arr));
    return 0;
}

static int check_dim(PyArrayObject *arr, const char *name, int axis, npy_intp expected, const char *what)
{
    npy_intp got = PyArray_DIM(arr, axis < 0 ? PyArray_NDIM(arr) + axis : axis);
    if (got == expected) return 1;
    PyErr_Format(PyExc_ValueError, "%s: expected %s of size %zd, got %zd", name, what, (Py_ssize_t)expected,
                 (Py_ssize_t)got);
    return 0;
}

/* ======================================================================== */
/* broadcast batches (attnc_batch, attnc_matrices)                          */

/* batch <- the broadcast of the leading (batch) dims of arrays, each of
 * which has `skip` trailing non-batch dims, right-aligned (NumPy rules). */
static int broadcast_batch(PyArrayObject **arrays, const char **names, int n, int skip, attnc_batch *batch)
{
    int nd = 0;
    for (int i = 0; i < n; i++)
        if (PyArray_NDIM(arrays[i]) - skip > nd) nd = PyArray_NDIM(arrays[i]) - skip;
    batch->ndim = nd;
    for (int d = 0; d < nd; d++) batch->shape[d] = 1;
    for (int i = 0; i < n; i++) {
        int ad = PyArray_NDIM(arrays[i]) - skip;
        for (int d = 0; d < ad; d++) {
            idx_t size = PyArray_DIM(arrays[i], d), *target = &batch->shape[nd - ad + d];
            if (size == *target || size == 1) continue;
            if (*target == 1) {
                *target = size;
                continue;
            }
            PyErr_Format(PyExc_ValueError, "%s: batch dimensions do not broadcast with those of %s", names[i],
                         names[0]);
            return 0;
        }
    }
    return 1;
}

/* strides (elements) of arr's batch dims aligned to a batch of nd dims:
 * 0 where arr has no such dim or it has size 1 (broadcast) */
static void batch_strides(PyArrayObject *arr, int skip, int nd, idx_t *strides)
{
    int ad = PyArray_NDIM(arr) - skip;
    for (int d = 0; d < nd; d++) {
        int a = d - (nd - ad);
        strides[d] = (a < 0 || PyArray_DIM(arr, a) == 1) ? 0 : elem_stride(arr, a);
    }
}

/* strides of a C-contiguous batch of matrices of matrix_size elements */
static void contiguous_batch_strides(const attnc_batch *batch, idx_t matrix_size, idx_t *strides)
{
    idx_t step = matrix_size;
    for (int d = batch->ndim - 1; d >= 0; d--) {
        strides[d] = batch->shape[d] == 1 ? 0 : step;
        if (!attnc_mul_ok(step, batch->shape[d], &step)) step = 0; /* only when the batch is empty */
    }
}

/* *count <- the product of sizes (0 if any is 0); MemoryError on overflow. */
static int count_items(int nd, const idx_t *sizes, idx_t *count, const char *name)
{
    *count = 1;
    for (int d = 0; d < nd; d++)
        if (sizes[d] == 0) {
            *count = 0;
            return 1;
        }
    for (int d = 0; d < nd; d++)
        if (!attnc_mul_ok(*count, sizes[d], count)) {
            PyErr_Format(PyExc_MemoryError, "%s: the batch is too large", name);
            return 0;
        }
    return 1;
}

/* ======================================================================== */
/* masks                                                                    */

#define MAX_SCORES_DIMS (NPY_MAXDIMS + 1) /* batch of up to 62, heads, L, S */

typedef struct {
    PyArrayObject *keep;            /* bool (a mask) or the call's reals (a bias), aligned; NULL when none */
    idx_t strides[MAX_SCORES_DIMS]; /* per scores dim, in elements; 0 where broadcast */
} mask_view;

/* An array that broadcasts to the scores (nd dims: batch..., L, S), as an
 * array of type_num of its own (un-broadcast) size: zero-stride axes of a
 * non-empty array are collapsed to length 1 before casting, so a broadcast
 * view is never expanded. A mask (NPY_BOOL): nonzero (NaN included) keeps a position,
 * as bool(x) does; a bias: the values, cast (bools refused, however given:
 * a mask passed as a bias would be added as 0 and 1). */
static int scores_operand(PyObject *obj, const char *name, int nd, const npy_intp *scores_shape,
                          const attnc_dtype *dt, mask_view *m)
{
    m->keep = NULL;
    if (obj == NULL || obj == Py_None) return 1;
    PyArrayObject *raw = real_array(obj, name);
    if (!raw) return 0;
    if (dt && PyArray_ISBOOL(raw)) { /* as converted: a torch bool tensor, a list of bools, True */
        PyErr_Format(PyExc_TypeError, "%s: expected floats added to the scores, got bools (a mask of keys to keep "
                     "is attn_mask; torch's True-means-hidden masks become a -inf bias)", name);
        Py_DECREF(raw);
        return 0;
    }
    int md = PyArray_NDIM(raw);
    int fits = md <= nd;
    for (int d = 0; fits && d < md; d++) {
        npy_intp size = PyArray_DIM(raw, d);
        fits = size == 1 || size == scores_shape[nd - md + d];
    }
    if (!fits) {
        PyObject *target = shape_tuple(nd, scores_shape);
        PyObject *given = target ? shape_tuple(md, PyArray_DIMS(raw)) : NULL;
        if (given)
            PyErr_Format(PyExc_ValueError, "%s: shape %R does not broadcast to the scores' shape %R", name, given,
                         target);
        Py_XDECREF(target);
        Py_XDECREF(given);
        Py_DECREF(raw);
        return 0;
    }
    PyArrayObject *collapsed = repeats_cut(raw, 1);
    Py_DECREF(raw);
    if (!collapsed) return 0;
    PyArray_Descr *descr = dt ? dtype_descr(*dt) : PyArray_DescrFromType(NPY_BOOL);
    m->keep = descr ? (dt ? cast_bias(collapsed, descr) : cast(collapsed, descr, 0)) : NULL;
    Py_DECREF(collapsed);
    if (!m->keep) return 0;
    for (int d = 0; d < nd; d++) {
        int a = d - (nd - md);
        m->strides[d] = (a < 0 || PyArray_DIM(m->keep, a) == 1) ? 0 : elem_stride(m->keep, a);
    }
    return 1;
}

/* ======================================================================== */
/* results                                                                  */

/* out, or (out, weights), (out, lse), (out, weights, lse) as asked for
 * (the extras not asked for are NULL); steals all three. */
static PyObject *pack_result(PyObject *out, PyObject *weights, PyObject *lse)
{
    if (!out || (!weights && !lse)) {
        Py_XDECREF(weights);
        Py_XDECREF(lse);
        return out;
    }
    PyObject *parts[3] = {out, weights ? weights : lse, weights ? lse : NULL};
    PyObject *result = PyTuple_New(parts[2] ? 3 : 2);
    for (int i = 0; i < 3; i++) {
        if (parts[i] && result) PyTuple_SET_ITEM(result, i, parts[i]); /* steals */
        else Py_XDECREF(parts[i]);
    }
    return result;
}

/* ValueError unless arr's shape is exactly (nd dims) shape. */
static int check_shape(PyArrayObject *arr, const char *name, int nd, const npy_intp *shape)
{
    int same = PyArray_NDIM(arr) == nd;
    for (int d = 0; same && d < nd; d++) same = PyArray_DIM(arr, d) == shape[d];
    if (!same) shape_error(name, nd, shape, arr);
    return same;
}

/* ======================================================================== */
/* linear(x, weight, bias=None, *, dtype=None) -> x @ weight.T + bias        */

static PyObject *py_linear(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"x", "weight", "bias", "dtype", NULL};
    PyObject *x_obj, *w_obj, *b_obj = Py_None, *dtype_obj = NULL, *result = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|O$O:linear", kwlist, &x_obj, &w_obj, &b_obj, &dtype_obj))
        return NULL;
    PyArrayObject *x = NULL, *w = NULL, *b = NULL;
    attnc_dtype dt = ATTNC_F32;
    int dtype_given;
    if (!dtype_argument(dtype_obj, &dtype_given, &dt)) return NULL;
    if (!(x = real_array(x_obj, "x")) || !(w = real_array(w_obj, "weight"))) goto done;
    if (b_obj != Py_None && !(b = real_array(b_obj, "bias"))) goto done;
    if (!dtype_given) dt = result_dtype((PyArrayObject *[]){x, w, b}, 3);
    if (!check_min_ndim(x, "x", 1, "(..., in_features)")) goto done;
    if (PyArray_NDIM(w) != 2) {
        PyObject *got = shape_tuple(PyArray_NDIM(w), PyArray_DIMS(w));
        if (got)
            PyErr_Format(PyExc_ValueError, "weight: expected 2 dimensions (out_features, in_features), got shape %R",
                         got);
        Py_XDECREF(got);
        goto done;
    }
    npy_intp n_out = PyArray_DIM(w, 0), n_in = PyArray_DIM(w, 1);
    if (!check_dim(x, "x", -1, n_in, "last dimension (in_features)")) goto done;
    if (b && (PyArray_NDIM(b) != 1 || PyArray_DIM(b, 0) != n_out)) {
        shape_error("bias", 1, &n_out, b);
        goto done;
    }
    /* a 2-D x is read with its strides, as the weight is (a gradient's dY^T
     * by columns: no copy first); x of other ranks is made C-contiguous,
     * so that its leading dims are rows n_in apart */
    int nd = PyArray_NDIM(x);
    if (!convert_in_place(&x, dt, nd != 2, "x") || !convert_in_place(&w, dt, 0, "weight") ||
        (b && !convert_in_place(&b, dt, 1, "bias")))
        goto done;
    npy_intp shape[NPY_MAXDIMS];
    for (int d = 0; d < nd - 1; d++) shape[d] = PyArray_DIM(x, d);
    shape[nd - 1] = n_out;
    idx_t rows;
    if (!count_items(nd - 1, shape, &rows, "x") || !(result = named(new_array(nd, shape, dt), "x, weight"))) goto done;
    if (PyArray_SIZE((PyArrayObject *)result) == 0) goto done;
    attnc_gemm_args g = {
        .M = rows, .K = n_in,
        .a = PyArray_DATA(x), .a_rs = nd == 2 ? elem_stride(x, 0) : n_in, .a_cs = nd == 2 ? elem_stride(x, 1) : 1,
        .n_parts = 1, .parts = {{PyArray_DATA(w), b ? PyArray_DATA(b) : NULL, n_out}},
        .b_rs = elem_stride(w, 0), .b_cs = elem_stride(w, 1),
        .c = PyArray_DATA((PyArrayObject *)result), .c_rs = n_out,
    };
    attnc_status status;
    RUN_KERNEL(status, attnc_kernels_for(dt)->gemm(&g));
    if (!kernel_ok(status, "linear")) Py_CLEAR(result);
done:
    Py_XDECREF(x);
    Py_XDECREF(w);
    Py_XDECREF(b);
    return result;
}

/* ======================================================================== */
/* softmax(x, axis=-1, *, dtype=None)                                        */

static PyObject *py_softmax(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"x", "axis", "dtype", NULL};
    PyObject *x_obj, *axis_obj = NULL, *dtype_obj = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O$O:softmax", kwlist, &x_obj, &axis_obj, &dtype_obj))
        return NULL;
    attnc_dtype dt = ATTNC_F32;
    int dtype_given, overflow = 0;
    long axis = -1;
    if (!dtype_argument(dtype_obj, &dtype_given, &dt)) return NULL;
    if (axis_obj && !as_long(axis_obj, "axis", &axis, &overflow)) return NULL;
    PyArrayObject *x = real_array(x_obj, "x");
    if (!x) return NULL;
    if (!dtype_given) dt = result_dtype(&x, 1);
    int nd = PyArray_NDIM(x);
    int span = nd > 0 ? nd : 1; /* a 0-d array is one row of one element */
    if (overflow || axis < -span || axis >= span) {
        PyErr_Format(PyExc_ValueError, "axis: %R is out of range for an array of %d dimensions", axis_obj, nd);
        Py_DECREF(x);
        return NULL;
    }
    if (axis < 0) axis += span;
    PyObject *result = NULL;
    if (!convert_in_place(&x, dt, 1, "x") || !(result = named(new_array(nd, PyArray_DIMS(x), dt), "x"))) goto done;
    if (PyArray_SIZE(x) == 0) goto done;
    idx_t outer = 1, n = nd > 0 ? PyArray_DIM(x, axis) : 1, inner = 1; /* products of a real array's dims */
    for (int d = 0; d < axis; d++) outer *= PyArray_DIM(x, d);
    for (int d = axis + 1; d < nd; d++) inner *= PyArray_DIM(x, d);
    attnc_status status;
    RUN_KERNEL(status, attnc_kernels_for(dt)->softmax(PyArray_DATA((PyArrayObject *)result), PyArray_DATA(x), outer,
                                                      n, inner));
    if (!kernel_ok(status, "softmax")) Py_CLEAR(result);
done:
    Py_XDECREF(x);
    return result;
}

/* ======================================================================== */
/* dropout(x, p=0.5, *, training=True, rng=None, dtype=None, seed=None)      */
/* seed: the mask's key (a module's backward repeats its forward's mask);   */
/* None draws one from rng.                                                 */

static PyObject *py_dropout(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"x", "p", "training", "rng", "dtype", "seed", NULL};
    PyObject *x_obj, *p_obj = NULL, *training_obj = NULL, *rng = Py_None, *dtype_obj = NULL, *seed_obj = Py_None;
    int training = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O$OOOO:dropout", kwlist, &x_obj, &p_obj, &training_obj, &rng,
                                     &dtype_obj, &seed_obj) ||
        !flag_argument(training_obj, "training", &training))
        return NULL;
    double p = 0.5;
    uint64_t seed = 0;
    attnc_dtype dt = ATTNC_F32;
    int dtype_given;
    if (!dtype_argument(dtype_obj, &dtype_given, &dt) || (p_obj && !probability(p_obj, "p", &p)) || !check_rng(rng) ||
        !seed_argument(seed_obj, &seed))
        return NULL;
    if (!training) p = 0.0; /* a fresh copy */
    PyArrayObject *x = real_array(x_obj, "x");
    if (!x) return NULL;
    if (!dtype_given) dt = result_dtype(&x, 1);
    PyObject *result = NULL;
    if (!convert_in_place(&x, dt, 1, "x") || !(result = named(new_array(PyArray_NDIM(x), PyArray_DIMS(x), dt), "x")))
        goto done;
    if (p > 0 && seed_obj == Py_None && !draw_seed(rng, &seed)) {
        Py_CLEAR(result);
        goto done;
    }
    if (PyArray_SIZE(x) == 0) goto done;
    attnc_status status;
    RUN_KERNEL(status, attnc_kernels_for(dt)->dropout(PyArray_DATA((PyArrayObject *)result), PyArray_DATA(x),
                                                      PyArray_SIZE(x), p, seed));
    if (!kernel_ok(status, "dropout")) Py_CLEAR(result);
done:
    Py_XDECREF(x);
    return result;
}

/* ======================================================================== */
/* attention operands, shared by the forward and the backward               */

/* The arguments that shape the scores, as given (NULL or None: default). */
typedef struct {
    PyObject *mask, *bias, *scale, *alignment, *window;
    int is_causal;
} score_options;

/* One side of a window: None (unbounded) or an integer >= 0. */
static int window_side(PyObject *obj, idx_t *side)
{
    long value;
    int overflow;
    if (obj == Py_None) {
        *side = ATTNC_UNBOUNDED;
        return 1;
    }
    if (!as_long(obj, "window", &value, &overflow)) return 0;
    if (overflow < 0 || (!overflow && value < 0)) {
        PyErr_Format(PyExc_ValueError, "window: each side must be None or an integer >= 0, got %R", obj);
        return 0;
    }
    *side = overflow > 0 || value > ATTNC_UNBOUNDED ? ATTNC_UNBOUNDED : (idx_t)value;
    return 1;
}

/* band <- the keys each query sees: is_causal, causal_alignment
 * ("top_left" or "bottom_right": the diagonal query i is aligned to is
 * key i, or key i + S - L) and window ((left, right) around it). */
static int band_arguments(const score_options *o, idx_t L, idx_t S, attnc_band *band)
{
    int bottom_right = 0;
    if (o->alignment) { /* exactly one of the two strings (None, or a NUL inside, is neither) */
        int is_str = PyUnicode_Check(o->alignment);
        bottom_right = is_str && PyUnicode_CompareWithASCIIString(o->alignment, "bottom_right") == 0;
        if (!bottom_right && !(is_str && PyUnicode_CompareWithASCIIString(o->alignment, "top_left") == 0)) {
            PyErr_Format(PyExc_ValueError, "causal_alignment: expected 'top_left' or 'bottom_right', got %R",
                         o->alignment);
            return 0;
        }
    }
    int windowed = o->window && o->window != Py_None;
    *band = (attnc_band){o->is_causal || windowed, bottom_right ? S - L : 0, ATTNC_UNBOUNDED, ATTNC_UNBOUNDED};
    if (windowed) {
        /* a tuple of its own, holding both sides: a list's items are borrowed,
         * and one side's __index__ could empty the list and free the other */
        PyObject *sides = PySequence_Check(o->window) && !PyUnicode_Check(o->window) ? PySequence_Tuple(o->window)
                                                                                      : NULL;
        if (!sides || PyTuple_GET_SIZE(sides) != 2) {
            Py_XDECREF(sides);
            if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_TypeError)) return 0; /* its own, Ctrl-C */
            raise_from_current(PyExc_TypeError, "window: expected None or a pair (left, right), got %R", o->window);
            return 0;
        }
        int ok = window_side(PyTuple_GET_ITEM(sides, 0), &band->left) &&
                 window_side(PyTuple_GET_ITEM(sides, 1), &band->right);
        Py_DECREF(sides);
        if (!ok) return 0;
    }
    if (o->is_causal && band->right > 0) band->right = 0;
    return 1;
}

/* query, key and value (arr[3], converted to dt with unit-stride rows),
 * their broadcast batch, sizes, strides, scale, band, mask and bias in a
 * (mask and bias hold their arrays); shape <- (batch..., L, S). dt: as
 * given, or the result dtype of arr and the n_extra other inputs. */
static int attention_operands(PyObject *const *objs, const score_options *o, int dtype_given, attnc_dtype *dt,
                              PyArrayObject *const *extra, int n_extra, PyArrayObject **arr, mask_view *mask,
                              mask_view *bias, attnc_attention_args *a, npy_intp *shape)
{
    static const char *names[3] = {"query", "key", "value"};
    static const char *layouts[3] = {"(..., L, E)", "(..., S, E)", "(..., S, Ev)"};
    double scale = 0.0;
    if (o->scale != Py_None && !finite_number(o->scale, "scale", &scale)) return 0;
    for (int i = 0; i < 3; i++)
        if (!(arr[i] = real_array(objs[i], names[i]))) return 0;
    if (!dtype_given) {
        PyArrayObject *inputs[8] = {arr[0], arr[1], arr[2]};
        for (int i = 0; i < n_extra; i++) inputs[3 + i] = extra[i];
        *dt = result_dtype(inputs, 3 + n_extra);
    }
    if (o->scale != Py_None && !scale_fits(scale, *dt)) return 0;
    for (int i = 0; i < 3; i++)
        if (!check_min_ndim(arr[i], names[i], 2, layouts[i])) return 0;
    npy_intp L = PyArray_DIM(arr[0], PyArray_NDIM(arr[0]) - 2), E = PyArray_DIM(arr[0], PyArray_NDIM(arr[0]) - 1);
    npy_intp S = PyArray_DIM(arr[1], PyArray_NDIM(arr[1]) - 2);
    npy_intp Ev = PyArray_DIM(arr[2], PyArray_NDIM(arr[2]) - 1);
    if (!check_dim(arr[1], "key", -1, E, "last dimension (E, as query)") ||
        !check_dim(arr[2], "value", -2, S, "sequence dimension (S, as key)") || !band_arguments(o, L, S, &a->band))
        return 0;
    a->L = L;
    a->S = S;
    a->E = E;
    a->Ev = Ev;
    a->scale = o->scale != Py_None ? scale : E > 0 ? 1.0 / sqrt((double)E) : 1.0;
    idx_t n_items;
    if (!broadcast_batch(arr, names, 3, 2, &a->batch) ||
        !count_items(a->batch.ndim, a->batch.shape, &n_items, "query"))
        return 0;
    for (int i = 0; i < 3; i++)
        if (!row_major_in_place(&arr[i], *dt, names[i])) return 0;
    int nb = a->batch.ndim;
    for (int d = 0; d < nb; d++) shape[d] = a->batch.shape[d];
    shape[nb] = L;
    shape[nb + 1] = S;
    if (!scores_operand(o->mask, "attn_mask", nb + 2, shape, NULL, mask) ||
        !scores_operand(o->bias, "attn_bias", nb + 2, shape, dt, bias))
        return 0;
    attnc_matrices *operands[3] = {&a->q, &a->k, &a->v};
    for (int i = 0; i < 3; i++) {
        operands[i]->data = PyArray_DATA(arr[i]);
        operands[i]->row_stride = elem_stride(arr[i], PyArray_NDIM(arr[i]) - 2);
        batch_strides(arr[i], 2, nb, operands[i]->batch_strides);
    }
    if (mask->keep) {
        a->mask = PyArray_DATA(mask->keep);
        for (int d = 0; d < nb; d++) a->mask_batch_strides[d] = mask->strides[d];
        a->mask_rs = mask->strides[nb];
        a->mask_cs = mask->strides[nb + 1];
    }
    if (bias->keep) {
        a->bias = PyArray_DATA(bias->keep);
        for (int d = 0; d < nb; d++) a->bias_batch_strides[d] = bias->strides[d];
        a->bias_rs = bias->strides[nb];
        a->bias_cs = bias->strides[nb + 1];
    }
    return 1;
}

/* A new C-contiguous array of shape (batch..., rows, cols) (cols < 0: no
 * last dim) and m pointing at it as a batch of matrices; zero-filled when
 * `zeros`. */
static PyObject *batch_result(const attnc_batch *batch, idx_t rows, idx_t cols, attnc_dtype dt, int zeros,
                              attnc_matrices *m)
{
    npy_intp shape[MAX_SCORES_DIMS];
    int nb = batch->ndim, nd = nb + (cols < 0 ? 1 : 2);
    for (int d = 0; d < nb; d++) shape[d] = batch->shape[d];
    shape[nb] = rows;
    if (cols >= 0) shape[nb + 1] = cols;
    PyObject *arr = new_array_of(nd, shape, dt, zeros);
    if (arr && m) {
        m->data = PyArray_DATA((PyArrayObject *)arr);
        m->row_stride = cols;
        contiguous_batch_strides(batch, rows * (cols < 0 ? 1 : cols), m->batch_strides);
    }
    return arr;
}

/* The gradient of a backward input (its array as converted), in the
 * input's shape (an array that owns its data, not a view of one of another
 * shape); C-contiguous, its batch aligned to the broadcast batch (1 on the
 * axes it is broadcast over or lacks), with m's batch strides 0 on those
 * axes, so that the kernel adds the items of a broadcast axis into one
 * gradient (*shared is set when there is one).
 * Zero-filled when it is such a sum or the kernel does not run
 * (kernel_runs 0: no item, query or key); else the kernel writes every
 * element (each item's rows, whole, by their key blocks or query tiles). */
static PyObject *input_grad_result(const attnc_batch *batch, PyArrayObject *input, idx_t rows, idx_t cols,
                                   attnc_dtype dt, int kernel_runs, attnc_matrices *m, int *shared)
{
    npy_intp shape[MAX_SCORES_DIMS];
    int nb = batch->ndim, first = nb - (PyArray_NDIM(input) - 2); /* the input's first batch axis in the batch */
    int summed = 0;
    for (int d = 0; d < nb; d++) {
        shape[d] = d >= first && PyArray_DIM(input, d - first) == batch->shape[d] ? batch->shape[d] : 1;
        summed |= shape[d] == 1 && batch->shape[d] > 1;
    }
    *shared |= summed;
    shape[nb] = rows;
    shape[nb + 1] = cols;
    PyObject *arr = new_array_of(PyArray_NDIM(input), PyArray_DIMS(input), dt, summed || !kernel_runs);
    if (arr) {
        m->data = PyArray_DATA((PyArrayObject *)arr);
        m->row_stride = cols;
        idx_t step = rows * cols; /* the array holds it */
        for (int d = nb - 1; d >= 0; d--) {
            m->batch_strides[d] = shape[d] == 1 ? 0 : step;
            step *= shape[d];
        }
    }
    return arr;
}

/* ======================================================================== */
/* scaled_dot_product_attention(query, key, value, attn_mask=None,           */
/*     dropout_p=0.0, is_causal=False, scale=None, rng=None,                 */
/*     return_weights=False, return_lse=False, attn_bias=None,               */
/*     causal_alignment="top_left", window=None, dtype=None, seed=None)      */

static PyObject *py_sdpa(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "rng",
                             "return_weights", "return_lse", "attn_bias", "causal_alignment", "window", "dtype",
                             "seed", NULL};
    PyObject *objs[3], *p_obj = NULL, *rng = Py_None, *dtype_obj = NULL, *seed_obj = Py_None;
    PyObject *causal_obj = NULL, *weights_obj = NULL, *lse_obj = NULL;
    score_options o = {Py_None, Py_None, Py_None, NULL, NULL, 0};
    int want_weights = 0, want_lse = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO|OOOOOOOOOOOO:scaled_dot_product_attention", kwlist,
                                     &objs[0], &objs[1], &objs[2], &o.mask, &p_obj, &causal_obj, &o.scale, &rng,
                                     &weights_obj, &lse_obj, &o.bias, &o.alignment, &o.window, &dtype_obj,
                                     &seed_obj) ||
        !flag_argument(causal_obj, "is_causal", &o.is_causal) ||
        !flag_argument(weights_obj, "return_weights", &want_weights) ||
        !flag_argument(lse_obj, "return_lse", &want_lse))
        return NULL;
    double dropout_p = 0.0;
    uint64_t seed = 0;
    attnc_dtype dt = ATTNC_F32;
    int dtype_given;
    if (!dtype_argument(dtype_obj, &dtype_given, &dt) || (p_obj && !probability(p_obj, "dropout_p", &dropout_p)) ||
        !check_rng(rng) || !seed_argument(seed_obj, &seed))
        return NULL;

    PyArrayObject *arr[3] = {NULL, NULL, NULL};
    PyObject *out = NULL, *weights = NULL, *lse = NULL;
    mask_view mask = {NULL}, bias = {NULL};
    attnc_attention_args a = {.dropout_p = dropout_p};
    npy_intp shape[MAX_SCORES_DIMS];
    if (!attention_operands(objs, &o, dtype_given, &dt, NULL, 0, arr, &mask, &bias, &a, shape)) goto done;
    int nb = a.batch.ndim;
    if (want_weights && !(weights = named(new_array(nb + 2, shape, dt), "return_weights"))) goto done;
    if (want_lse && !(lse = named(batch_result(&a.batch, a.L, -1, compute_dtype(dt), 0, NULL), "return_lse")))
        goto done;
    if (!(out = named(batch_result(&a.batch, a.L, a.Ev, dt, 0, &a.out), "query"))) goto done;
    if (dropout_p > 0 && seed_obj == Py_None && !draw_seed(rng, &seed)) goto done;
    if (PyArray_SIZE((PyArrayObject *)out) == 0 && (!weights || PyArray_SIZE((PyArrayObject *)weights) == 0) &&
        (!lse || PyArray_SIZE((PyArrayObject *)lse) == 0))
        goto done;
    a.seed = seed;
    a.weights = weights ? PyArray_DATA((PyArrayObject *)weights) : NULL;
    a.lse = lse ? PyArray_DATA((PyArrayObject *)lse) : NULL;
    attnc_status status;
    RUN_KERNEL(status, attnc_kernels_for(dt)->attention(&a));
    kernel_ok(status, "scaled_dot_product_attention");
done:
    if (PyErr_Occurred()) {
        Py_CLEAR(out);
        Py_CLEAR(weights);
        Py_CLEAR(lse);
    }
    for (int i = 0; i < 3; i++) Py_XDECREF(arr[i]);
    Py_XDECREF(mask.keep);
    Py_XDECREF(bias.keep);
    return pack_result(out, weights, lse);
}

/* ======================================================================== */
/* scaled_dot_product_attention_backward(grad_out, query, key, value, out,  */
/*     lse, attn_mask=None, is_causal=False, scale=None, dropout_p=0.0, *,   */
/*     attn_bias=None, causal_alignment="top_left", window=None, dtype=None) */
/*     -> (grad_query, grad_key, grad_value), each of its input's batch     */
/*     shape aligned to the broadcast batch (1 where the input is           */
/*     broadcast: summed over that axis), then its matrix's                 */

static PyObject *py_sdpa_backward(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"grad_out", "query", "key", "value", "out", "lse", "attn_mask", "is_causal", "scale",
                             "dropout_p", "attn_bias", "causal_alignment", "window", "dtype", "seed", NULL};
    PyObject *grad_obj, *objs[3], *out_obj, *lse_obj, *p_obj = NULL, *dtype_obj = NULL, *seed_obj = Py_None;
    PyObject *causal_obj = NULL;
    score_options o = {Py_None, Py_None, Py_None, NULL, NULL, 0};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOO|OOOO$OOOOO:scaled_dot_product_attention_backward",
                                     kwlist, &grad_obj, &objs[0], &objs[1], &objs[2], &out_obj, &lse_obj, &o.mask,
                                     &causal_obj, &o.scale, &p_obj, &o.bias, &o.alignment, &o.window, &dtype_obj,
                                     &seed_obj) ||
        !flag_argument(causal_obj, "is_causal", &o.is_causal))
        return NULL;
    double dropout_p = 0.0;
    uint64_t seed = 0;
    attnc_dtype dt = ATTNC_F32;
    int dtype_given;
    if (!dtype_argument(dtype_obj, &dtype_given, &dt) || (p_obj && !probability(p_obj, "dropout_p", &dropout_p)) ||
        !seed_argument(seed_obj, &seed))
        return NULL;
    if (dropout_p > 0 && seed_obj == Py_None)
        return PyErr_Format(PyExc_ValueError, "dropout_p: the backward of dropout needs the forward's mask: give "
                            "the seed the forward used (seed=); a module's backward does this itself");

    static const char *saved_names[3] = {"grad_out", "out", "lse"};
    PyObject *saved_objs[3] = {grad_obj, out_obj, lse_obj};
    PyArrayObject *saved[3] = {NULL, NULL, NULL}, *arr[3] = {NULL, NULL, NULL};
    PyObject *grads[3] = {NULL, NULL, NULL}, *result = NULL;
    mask_view mask = {NULL}, bias = {NULL};
    attnc_attention_backward_args g = {.forward = {.dropout_p = dropout_p, .seed = seed}};
    attnc_attention_args *a = &g.forward;
    npy_intp shape[MAX_SCORES_DIMS];
    for (int i = 0; i < 3; i++)
        if (!(saved[i] = real_array(saved_objs[i], saved_names[i]))) goto done;
    /* grad_out and out count in the dtype; lse never does (float for the 16-bit dtypes) */
    if (!attention_operands(objs, &o, dtype_given, &dt, saved, 2, arr, &mask, &bias, a, shape)) goto done;
    int nb = a->batch.ndim;
    shape[nb + 1] = a->Ev; /* grad_out and out: (batch..., L, Ev); lse: (batch..., L) */
    if (!check_shape(saved[0], "grad_out", nb + 2, shape) || !check_shape(saved[1], "out", nb + 2, shape) ||
        !check_shape(saved[2], "lse", nb + 1, shape))
        goto done;
    if (!row_major_in_place(&saved[0], dt, "grad_out") || !row_major_in_place(&saved[1], dt, "out") ||
        !convert_in_place(&saved[2], compute_dtype(dt), 1, "lse"))
        goto done;
    attnc_matrices *from[2] = {&g.grad_out, &a->out};
    for (int i = 0; i < 2; i++) {
        from[i]->data = PyArray_DATA(saved[i]);
        from[i]->row_stride = elem_stride(saved[i], nb);
        batch_strides(saved[i], 2, nb, from[i]->batch_strides);
    }
    g.lse = PyArray_DATA(saved[2]);
    idx_t n_items; /* (counted without overflow by attention_operands) */
    if (!count_items(nb, a->batch.shape, &n_items, "query")) goto done;
    int shared = 0, runs = n_items > 0 && a->L > 0 && a->S > 0;
    if (!(grads[0] = input_grad_result(&a->batch, arr[0], a->L, a->E, dt, runs, &g.grad_q, &shared)) ||
        !(grads[1] = input_grad_result(&a->batch, arr[1], a->S, a->E, dt, runs, &g.grad_k, &shared)) ||
        !(grads[2] = input_grad_result(&a->batch, arr[2], a->S, a->Ev, dt, runs, &g.grad_v, &shared)))
        goto done;
    if (shared && compute_dtype(dt) != dt) { /* the kernel sums in the gradients' own dtype */
        PyErr_SetString(PyExc_ValueError, "dtype: gradients summed over a broadcast batch of 16-bit inputs are "
                                          "summed in float32: pass dtype=numpy.float32 (attnc.functional does)");
        goto done;
    }
    attnc_status status;
    RUN_KERNEL(status, attnc_kernels_for(dt)->attention_backward(&g));
    if (kernel_ok(status, "scaled_dot_product_attention_backward"))
        result = PyTuple_Pack(3, grads[0], grads[1], grads[2]);
done:
    for (int i = 0; i < 3; i++) {
        Py_XDECREF(grads[i]);
        Py_XDECREF(arr[i]);
        Py_XDECREF(saved[i]);
    }
    Py_XDECREF(mask.keep);
    Py_XDECREF(bias.keep);
    return result;
}

/* ======================================================================== */
/* self_attention(x, params, spec, attention_mask, dtype, dropout_p=0.0,    */
/*     training=False, rng=None, return_weights=False, scale=None,           */
/*     save=False)                                                           */
/*                                                                          */
/* A whole module forward. spec, built once at the module's construction   */
/* (attnc/attention.py), describes the module:                              */
/*   (names, dropout_name, (in_dim, qk_dim, v_dim, out_dim), n_heads,       */
/*    heads_axis, fused[, nan_rows])                                        */
/* names: the state_dict keys of params, in order: the Q, K, V weight and   */
/* bias (fused: the one (3 * qk_dim, in_dim) weight and bias), then the     */
/* output projection's weight and bias when out_dim >= 0. heads_axis: the  */
/* weights and mask have a heads axis (needed when n_heads > 1). nan_rows: */
/* a row of -inf scores gives NaN, as torch.softmax (the documents'         */
/* modules); false (the default, and nn.MultiheadAttention's): 0.           */

typedef struct {
    PyObject *names, *dropout_name;
    Py_ssize_t in_dim, qk_dim, v_dim, out_dim, n_heads;
    int heads_axis, fused, nan_rows;
    Py_ssize_t n_params;
} module_spec;

/* A spec's sizes at most: the fused weight's 3 qk_dim rows and the
 * projections' qk_dim + qk_dim + v_dim columns are counted without
 * overflow (a qk_dim of (2**64 + 26) / 3 had made 26 rows) */
#define SPEC_DIM_MAX (PY_SSIZE_T_MAX / 4)

static int parse_spec(PyObject *obj, module_spec *s)
{
    if (!tuple_argument(obj, "spec")) return 0;
    s->nan_rows = 0;
    if (!PyArg_ParseTuple(obj, "O!U(nnnn)npp|p:self_attention spec", &PyTuple_Type, &s->names, &s->dropout_name,
                          &s->in_dim, &s->qk_dim, &s->v_dim, &s->out_dim, &s->n_heads, &s->heads_axis, &s->fused,
                          &s->nan_rows)) {
        name_the_error("spec");
        return 0;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(s->names); i++)
        if (!PyUnicode_Check(PyTuple_GET_ITEM(s->names, i))) {
            PyErr_Format(PyExc_TypeError, "spec: expected parameter names of type str, got %R", s->names);
            return 0;
        }
    s->n_params = (s->fused ? 2 : 6) + (s->out_dim >= 0 ? 2 : 0);
    if (PyTuple_GET_SIZE(s->names) == s->n_params && s->in_dim > 0 && s->n_heads > 0 && s->qk_dim % s->n_heads == 0 &&
        s->v_dim % s->n_heads == 0 && s->qk_dim > 0 && s->v_dim > 0 && (!s->fused || s->qk_dim == s->v_dim) &&
        s->in_dim <= SPEC_DIM_MAX && s->qk_dim <= SPEC_DIM_MAX && s->v_dim <= SPEC_DIM_MAX &&
        s->out_dim <= SPEC_DIM_MAX && s->out_dim != 0 && /* (< 0: no output projection; none maps to 0 features) */
        (s->heads_axis || s->n_heads == 1)) /* the weights and mask have a heads axis with several heads */
        return 1;
    PyErr_Format(PyExc_ValueError, "spec: inconsistent module description %R", obj);
    return 0;
}

/* A module parameter as an array of dt with shape (rows, cols), or (rows,)
 * for a bias (cols < 0; None allowed: no bias). An array that already fits
 * (C-contiguous, aligned, native dt) is used in place, any other is
 * converted, so a parameter of any layout works. *arr: a new reference,
 * NULL for None. Errors name the parameter by its state_dict key. */
static int module_param(PyObject *obj, PyObject *name, attnc_dtype dt, npy_intp rows, npy_intp cols,
                        PyArrayObject **arr)
{
    int nd = cols < 0 ? 1 : 2;
    npy_intp expected[2] = {rows, cols};
    *arr = NULL;
    if (obj == Py_None && nd == 1) return 1;
    const char *cname = PyUnicode_AsUTF8(name);
    if (!cname) return 0;
    if (obj == Py_None) {
        PyObject *want = shape_tuple(nd, expected);
        if (want) PyErr_Format(PyExc_TypeError, "%s: expected an array of shape %R, got None", cname, want);
        Py_XDECREF(want);
        return 0;
    }
    /* (an ndarray itself, not a subclass: a masked array's check is real_values') */
    if (PyArray_CheckExact(obj) && has_dtype((PyArrayObject *)obj, dt) && PyArray_ISCARRAY_RO((PyArrayObject *)obj)) {
        /* a view of its own, held for the call (another thread may rebind the
         * attribute), which holds the memory's owner: a parameter that is a
         * view of another array had left that array free to be resized by a
         * callback or a thread during the call */
        if (!(*arr = (PyArrayObject *)PyArray_View((PyArrayObject *)obj, NULL, &PyArray_Type))) return 0;
    } else if (!(*arr = real_input(obj, cname, dt, 1))) {
        return 0;
    }
    if (PyArray_NDIM(*arr) == nd && PyArray_DIM(*arr, 0) == rows && (nd == 1 || PyArray_DIM(*arr, 1) == cols))
        return 1;
    shape_error(cname, nd, expected, *arr);
    Py_CLEAR(*arr);
    return 0;
}

#define MAX_PARAMS 8 /* Q, K, V and output projections, weight and bias each */

/* The expected shapes of one projection's weight (out, in) and bias (out,)
 * appended to rows/cols at *n (cols < 0 marks a bias). */
static void expect_projection(npy_intp *rows, npy_intp *cols, int *n, npy_intp out_features, npy_intp in_features)
{
    rows[*n] = rows[*n + 1] = out_features;
    cols[*n] = in_features;
    cols[*n + 1] = -1;
    *n += 2;
}

/* Checks (and converts, see module_param) every parameter against the
 * shapes spec gives, holding each in held[], and points s at them: the Q,
 * K and V weights (D, C) and biases (D), or the row blocks of the fused
 * (3 D, C) projection; the output projection (out_dim, Dv) if any. */
static int module_params(PyObject *params, const module_spec *spec, attnc_dtype dt, PyArrayObject **held,
                         attnc_self_attention_args *s)
{
    npy_intp qk = spec->qk_dim, v = spec->v_dim, C = spec->in_dim;
    npy_intp rows[MAX_PARAMS], cols[MAX_PARAMS];
    int n = 0;
    if (spec->fused) {
        expect_projection(rows, cols, &n, 3 * qk, C);
    } else {
        expect_projection(rows, cols, &n, qk, C);
        expect_projection(rows, cols, &n, qk, C);
        expect_projection(rows, cols, &n, v, C);
    }
    int first_out = n;
    if (spec->out_dim >= 0) expect_projection(rows, cols, &n, spec->out_dim, v);
    for (int i = 0; i < n; i++)
        if (!module_param(PyTuple_GET_ITEM(params, i), PyTuple_GET_ITEM(spec->names, i), dt, rows[i], cols[i],
                          &held[i]))
            return 0;
    size_t item = attnc_dtype_size(dt);
    for (int p = 0; p < 3; p++) {
        if (spec->fused) { /* row block p of the fused weight and bias */
            s->w[p] = (const char *)PyArray_DATA(held[0]) + (size_t)(p * qk * C) * item;
            s->bias[p] = held[1] ? (const char *)PyArray_DATA(held[1]) + (size_t)(p * qk) * item : NULL;
        } else {
            s->w[p] = PyArray_DATA(held[2 * p]);
            s->bias[p] = held[2 * p + 1] ? PyArray_DATA(held[2 * p + 1]) : NULL;
        }
        s->dim[p] = p == ATTNC_V ? v : qk;
    }
    if (first_out < n) {
        s->w_out = PyArray_DATA(held[first_out]);
        s->bias_out = held[first_out + 1] ? PyArray_DATA(held[first_out + 1]) : NULL;
    }
    return 1;
}

/* What a forward and a backward of a module share: spec, dtype and
 * parameters checked (held[] holds them), the dropout probability (0 unless
 * training) and scale; then module_input. */
typedef struct {
    module_spec spec;
    attnc_dtype dt;
    PyArrayObject *held[MAX_PARAMS]; /* by position in params */
    PyArrayObject *x;
    mask_view mask;
    int ns;                          /* dims of the scores: batch..., [heads,] T, T */
    npy_intp shape[MAX_SCORES_DIMS]; /* the scores' shape */
    attnc_self_attention_args s;
} module_call;

static void module_call_release(module_call *c)
{
    for (int i = 0; i < MAX_PARAMS; i++) Py_XDECREF(c->held[i]);
    Py_XDECREF(c->x);
    Py_XDECREF(c->mask.keep);
}

static int module_setup(module_call *c, PyObject *params, PyObject *spec_obj, PyObject *dtype_obj, PyObject *p_obj,
                        int training, PyObject *scale_obj)
{
    int dtype_given;
    if (!parse_spec(spec_obj, &c->spec) || !dtype_argument(dtype_obj, &dtype_given, &c->dt)) return 0;
    if (!dtype_given) {
        PyErr_Format(PyExc_TypeError, "dtype: expected the module's dtype, got None");
        return 0;
    }
    if (PyTuple_GET_SIZE(params) != c->spec.n_params) {
        PyErr_Format(PyExc_TypeError, "params: expected a tuple of %zd parameters, got %zd", c->spec.n_params,
                     PyTuple_GET_SIZE(params));
        return 0;
    }
    double dropout_p = 0.0, scale = 0.0;
    if (p_obj) {
        const char *p_name = PyUnicode_AsUTF8(c->spec.dropout_name);
        if (!p_name || !probability(p_obj, p_name, &dropout_p)) return 0;
    }
    if (scale_obj != Py_None && (!finite_number(scale_obj, "scale", &scale) || !scale_fits(scale, c->dt))) return 0;
    c->s = (attnc_self_attention_args){
        .dtype = c->dt, .C = c->spec.in_dim, .n_out = c->spec.out_dim >= 0 ? c->spec.out_dim : 0,
        .dropout_p = training ? dropout_p : 0.0, .nan_rows = c->spec.nan_rows,
    };
    if (!module_params(params, &c->spec, c->dt, c->held, &c->s)) return 0;
    c->s.scale = scale_obj != Py_None ? scale : 1.0 / sqrt((double)(c->spec.qk_dim / c->spec.n_heads));
    return 1;
}

/* x (..., T, C) and the mask: the batch is (leading dims of x..., heads). */
static int module_input(module_call *c, PyObject *x_obj, PyObject *mask_obj, int want_weights)
{
    module_spec *spec = &c->spec;
    if (!(c->x = real_input(x_obj, "x", c->dt, 1)) || !check_min_ndim(c->x, "x", 2, "(..., seq, dim)") ||
        !check_dim(c->x, "x", -1, spec->in_dim, "last dimension"))
        return 0;
    int nb = PyArray_NDIM(c->x) - 2;
    c->ns = nb + (spec->heads_axis ? 1 : 0) + 2;
    if (want_weights && c->ns > NPY_MAXDIMS) {
        PyErr_Format(PyExc_ValueError, "x: %d dimensions are too many for the attention weights (%d dimensions "
                     "(..., heads, seq, seq); NumPy allows %d)", PyArray_NDIM(c->x), c->ns, NPY_MAXDIMS);
        return 0;
    }
    attnc_self_attention_args *s = &c->s;
    s->T = PyArray_DIM(c->x, nb);
    s->x = PyArray_DATA(c->x);
    s->batch.ndim = nb + 1;
    for (int d = 0; d < nb; d++) s->batch.shape[d] = PyArray_DIM(c->x, d);
    s->batch.shape[nb] = spec->n_heads;
    idx_t n_items;
    if (!count_items(s->batch.ndim, s->batch.shape, &n_items, "x")) return 0;
    for (int d = 0; d < nb; d++) c->shape[d] = PyArray_DIM(c->x, d);
    if (spec->heads_axis) c->shape[nb] = spec->n_heads;
    c->shape[c->ns - 2] = c->shape[c->ns - 1] = s->T;
    if (!scores_operand(mask_obj, "attention_mask", c->ns, c->shape, NULL, &c->mask)) return 0;
    if (c->mask.keep) {
        s->mask = PyArray_DATA(c->mask.keep);
        for (int d = 0; d < nb; d++) s->mask_batch_strides[d] = c->mask.strides[d];
        s->mask_batch_strides[nb] = spec->heads_axis ? c->mask.strides[nb] : 0;
        s->mask_rs = c->mask.strides[c->ns - 2];
        s->mask_cs = c->mask.strides[c->ns - 1];
    }
    return 1;
}

/* The module output's shape (..., T, n_out or Dv) into shape; its ndim. */
static int module_output_shape(const module_call *c, npy_intp *shape)
{
    int nd = PyArray_NDIM(c->x);
    for (int d = 0; d < nd - 1; d++) shape[d] = PyArray_DIM(c->x, d);
    shape[nd - 1] = c->spec.out_dim >= 0 ? c->spec.out_dim : c->spec.v_dim;
    return nd;
}

/* The kept buffers' shapes: qkv (rows, width), merged (rows, Dv), lse (n_items, T). */
static void kept_shapes(const module_call *c, npy_intp shapes[3][2])
{
    idx_t rows = PyArray_SIZE(c->x) / (c->spec.in_dim > 0 ? c->spec.in_dim : 1);
    shapes[0][0] = shapes[1][0] = rows;
    shapes[0][1] = 2 * c->spec.qk_dim + c->spec.v_dim;
    shapes[1][1] = c->spec.v_dim;
    shapes[2][0] = rows / (c->s.T > 0 ? c->s.T : 1) * c->spec.n_heads;
    shapes[2][1] = c->s.T;
}

/* ------------------------------------------------------------------------ */
/* frozen modules: weights no one can write, packed once                     */

/* A capsule's pointer: the packs of a frozen module's weights, the arrays
 * they were packed from (held: their memory is never another's while the
 * packs live) and where those hold the weights. */
#define FROZEN_CAPSULE "attnc._C.frozen_weights"
typedef struct {
    attnc_packed_module packs;
    PyObject *params; /* the frozen parameters (a tuple) */
    attnc_self_attention_args weights; /* their w, dim, w_out, n_out, C, dtype */
} frozen_weights;

static void frozen_weights_free(PyObject *capsule)
{
    frozen_weights *f = PyCapsule_GetPointer(capsule, FROZEN_CAPSULE);
    if (!f) return;
    attnc_packed_module_free(&f->packs);
    Py_XDECREF(f->params);
    PyMem_Free(f);
}

/* A read-only copy of arr that no one can make writable: an array over an
 * immutable bytes object (NumPy refuses WRITEABLE on such a base), in huge
 * pages where they are given, filled by copy_into_polling (each weight
 * copied by one memcpy, holding the GIL, made Ctrl-C wait for the copies
 * of all four of a MultiHeadAttention(8192): 0.8 s). */
static PyObject *frozen_copy(PyArrayObject *arr)
{
    Py_ssize_t size = (Py_ssize_t)PyArray_NBYTES(arr);
    PyObject *bytes = PyBytes_FromStringAndSize(NULL, size);
    if (!bytes) return NULL;
    attnc_ask_for_huge_pages(PyBytes_AS_STRING(bytes), (size_t)size);
    PyArray_Descr *descr = PyArray_DESCR(arr);
    Py_INCREF(descr);
    PyArrayObject *copy = (PyArrayObject *)PyArray_NewFromDescr(
        &PyArray_Type, descr, PyArray_NDIM(arr), PyArray_DIMS(arr), NULL, PyBytes_AS_STRING(bytes),
        NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED | NPY_ARRAY_WRITEABLE, NULL);
    if (!copy) {
        Py_DECREF(bytes);
        return NULL;
    }
    if (PyArray_SetBaseObject(copy, bytes) < 0 || !copy_into_polling(copy, arr)) { /* (SetBase takes bytes even then) */
        Py_DECREF(copy);
        return NULL;
    }
    PyArray_CLEARFLAGS(copy, NPY_ARRAY_WRITEABLE);
    return (PyObject *)copy;
}

/* read_only_copy(array, dtype, name) -> array in dtype, copied as
 * frozen_copy copies (read-only for good, Ctrl-C asked about between
 * blocks): a frozen module's parameters that freeze_module does not take. */
static PyObject *py_read_only_copy(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"array", "dtype", "name", NULL};
    PyObject *obj, *dtype_obj;
    const char *name = "array";
    int dtype_given;
    attnc_dtype dt;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|s:read_only_copy", kwlist, &obj, &dtype_obj, &name) ||
        !dtype_argument(dtype_obj, &dtype_given, &dt))
        return NULL;
    if (!dtype_given) {
        PyErr_Format(PyExc_TypeError, "dtype: expected the module's dtype, got None");
        return NULL;
    }
    PyArrayObject *arr = real_input(obj, name, dt, 1);
    if (!arr) return NULL;
    PyObject *copy = frozen_copy(arr);
    Py_DECREF(arr);
    return copy;
}

/* Whether s's weights are the frozen ones f was packed from. */
static int frozen_weights_match(const frozen_weights *f, const attnc_self_attention_args *s)
{
    const attnc_self_attention_args *w = &f->weights;
    int same = s->dtype == w->dtype && s->C == w->C && s->w_out == w->w_out && s->n_out == w->n_out;
    for (int p = 0; p < 3; p++) same &= s->w[p] == w->w[p] && s->dim[p] == w->dim[p];
    return same;
}

/* freeze_module(params, spec, dtype) -> (frozen params, packs): read-only
 * copies of a module's parameters (frozen_copy) and a capsule of their
 * projection weights packed for the active kernels, for self_attention's
 * `packed`. */
static PyObject *py_freeze_module(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"params", "spec", "dtype", NULL};
    PyObject *params, *spec_obj, *dtype_obj, *frozen = NULL, *result = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO:freeze_module", kwlist, &params, &spec_obj, &dtype_obj) ||
        !tuple_argument(params, "params"))
        return NULL;
    module_call given = {.held = {NULL}}, c = {.held = {NULL}};
    frozen_weights *f = NULL;
    if (!module_setup(&given, params, spec_obj, dtype_obj, NULL, 0, Py_None)) goto done;
    Py_ssize_t n = PyTuple_GET_SIZE(params);
    if (!(frozen = PyTuple_New(n))) goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *copy = given.held[i] ? frozen_copy(given.held[i]) : (Py_INCREF(Py_None), Py_None);
        if (!copy) goto done;
        PyTuple_SET_ITEM(frozen, i, copy);
    }
    if (!module_setup(&c, frozen, spec_obj, dtype_obj, NULL, 0, Py_None)) goto done;
    if (!(f = PyMem_Calloc(1, sizeof *f))) {
        PyErr_NoMemory();
        goto done;
    }
    attnc_status status;
    RUN_KERNEL(status, attnc_pack_module(&c.s, &f->packs));
    if (!kernel_ok(status, "freeze_module")) goto done;
    Py_INCREF(frozen);
    f->params = frozen;
    f->weights = c.s;
    PyObject *capsule = PyCapsule_New(f, FROZEN_CAPSULE, frozen_weights_free);
    if (!capsule) goto done;
    f = NULL; /* the capsule's */
    result = PyTuple_Pack(2, frozen, capsule);
    Py_DECREF(capsule);
done:
    if (f) {
        attnc_packed_module_free(&f->packs);
        Py_XDECREF(f->params);
        PyMem_Free(f);
    }
    Py_XDECREF(frozen);
    module_call_release(&given);
    module_call_release(&c);
    return result;
}

static PyObject *py_self_attention(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"x", "params", "spec", "attention_mask", "dtype", "dropout_p", "training", "rng",
                             "return_weights", "scale", "save", "packed", NULL};
    PyObject *x_obj, *params, *spec_obj, *mask_obj = Py_None, *dtype_obj = NULL, *p_obj = NULL, *rng = Py_None,
             *training_obj = NULL, *weights_obj = NULL, *scale_obj = Py_None, *save_obj = NULL, *packed_obj = Py_None;
    int training = 0, want_weights = 0, save = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOO|OOOOOOO:self_attention", kwlist, &x_obj, &params, &spec_obj,
                                     &mask_obj, &dtype_obj, &p_obj, &training_obj, &rng, &weights_obj, &scale_obj,
                                     &save_obj, &packed_obj) ||
        !tuple_argument(params, "params") || !flag_argument(training_obj, "training", &training) ||
        !flag_argument(weights_obj, "return_weights", &want_weights) || !flag_argument(save_obj, "save", &save))
        return NULL;
    if (packed_obj != Py_None && !PyCapsule_IsValid(packed_obj, FROZEN_CAPSULE)) {
        PyErr_Format(PyExc_TypeError, "packed: expected what freeze_module returned, or None, got %s",
                     Py_TYPE(packed_obj)->tp_name);
        return NULL;
    }
    module_call c = {.held = {NULL}};
    PyObject *out = NULL, *weights = NULL, *kept[3] = {NULL, NULL, NULL}, *saved = NULL;
    uint64_t seed = 0;
    if (!module_setup(&c, params, spec_obj, dtype_obj, p_obj, training, scale_obj) || !check_rng(rng) ||
        !module_input(&c, x_obj, mask_obj, want_weights))
        goto done;
    attnc_self_attention_args *s = &c.s;
    if (packed_obj != Py_None) { /* (the caller's argument holds the capsule through the call) */
        const frozen_weights *f = PyCapsule_GetPointer(packed_obj, FROZEN_CAPSULE);
        if (frozen_weights_match(f, s)) s->packed = &f->packs; /* else packed per call, as ever */
    }
    npy_intp shape[NPY_MAXDIMS], kept_shape[3][2];
    if (want_weights && !(weights = named(new_array(c.ns, c.shape, c.dt), "return_weights"))) goto done;
    if (!(out = named(new_array(module_output_shape(&c, shape), shape, c.dt), "x"))) goto done;
    if (s->dropout_p > 0 && !draw_seed(rng, &seed)) goto done;
    if (save) { /* the backward's: a private x, the kept buffers, the seed */
        kept_shapes(&c, kept_shape);
        for (int i = 0; i < 3; i++)
            if (!(kept[i] = new_array(2, kept_shape[i], i == 2 ? compute_dtype(c.dt) : c.dt))) goto done; /* lse */
        if ((PyObject *)c.x == x_obj || !PyArray_CHKFLAGS(c.x, NPY_ARRAY_OWNDATA)) { /* the caller's memory */
            PyArray_Descr *descr = PyArray_DESCR(c.x);
            Py_INCREF(descr);
            PyArrayObject *copy = copy_as(c.x, descr, NPY_ARRAY_CARRAY | NPY_ARRAY_ENSURECOPY);
            if (!copy) goto done;
            Py_SETREF(c.x, copy);
            s->x = PyArray_DATA(c.x);
        }
        s->keep_qkv = PyArray_DATA((PyArrayObject *)kept[0]);
        s->keep_merged = PyArray_DATA((PyArrayObject *)kept[1]);
        s->lse = PyArray_DATA((PyArrayObject *)kept[2]);
    }
    s->seed = seed;
    s->out = PyArray_DATA((PyArrayObject *)out);
    s->weights = weights ? PyArray_DATA((PyArrayObject *)weights) : NULL;
    if (PyArray_SIZE((PyArrayObject *)out) > 0) { /* else the weights are empty too */
        attnc_status status;
        RUN_KERNEL(status, attnc_self_attention(s));
        if (!kernel_ok(status, "self_attention")) goto done;
    } else {
        for (int i = 0; i < 3 && kept[i]; i++) PyArray_FILLWBYTE((PyArrayObject *)kept[i], 0);
    }
    if (save && !(saved = Py_BuildValue("(OOOOK)", c.x, kept[0], kept[1], kept[2], (unsigned long long)seed)))
        goto done;
done:
    if (PyErr_Occurred()) {
        Py_CLEAR(out);
        Py_CLEAR(weights);
    }
    for (int i = 0; i < 3; i++) Py_XDECREF(kept[i]);
    module_call_release(&c);
    if (!save || !out) return pack_result(out, weights, NULL);
    PyObject *result = pack_result(out, weights, NULL);
    PyObject *pair = result ? PyTuple_Pack(2, result, saved) : NULL;
    Py_XDECREF(result);
    Py_XDECREF(saved);
    return pair;
}

/* An array a forward kept (self_attention(..., save=True)): of the call's
 * dtype, C-contiguous, aligned and exactly of shape (rows, cols). */
static int kept_array(PyObject *obj, const char *name, attnc_dtype dt, const npy_intp *shape)
{
    if (PyArray_CheckExact(obj) && has_dtype((PyArrayObject *)obj, dt) && PyArray_ISCARRAY_RO((PyArrayObject *)obj) &&
        check_shape((PyArrayObject *)obj, name, 2, shape))
        return 1;
    if (!PyErr_Occurred())
        PyErr_Format(PyExc_ValueError, "saved: %s is not what this module's forward kept", name);
    return 0;
}

/* self_attention_backward(grad_output, saved, params, spec,               */
/*     attention_mask=None, *, dtype, dropout_p=0.0, scale=None)            */
/* -> (grad_x, grad_w (Dq+Dk+Dv, C), grad_bias (Dq+Dk+Dv), grad_w_out or    */
/*     None, grad_bias_out or None); saved: what self_attention(...,        */
/*     save=True) returned: (x, qkv, merged, lse, seed).                    */
static PyObject *py_self_attention_backward(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"grad_output", "saved", "params", "spec", "attention_mask", "dtype", "dropout_p",
                             "scale", NULL};
    PyObject *grad_obj, *saved, *params, *spec_obj, *mask_obj = Py_None, *dtype_obj = NULL, *p_obj = NULL,
             *scale_obj = Py_None, *x_obj, *kept[3], *seed_obj;
    uint64_t seed = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOO|O$OOO:self_attention_backward", kwlist, &grad_obj, &saved,
                                     &params, &spec_obj, &mask_obj, &dtype_obj, &p_obj, &scale_obj) ||
        !tuple_argument(saved, "saved") || !tuple_argument(params, "params"))
        return NULL;
    if (!PyArg_ParseTuple(saved, "O!O!O!O!O:self_attention_backward saved", &PyArray_Type, &x_obj, &PyArray_Type,
                          &kept[0], &PyArray_Type, &kept[1], &PyArray_Type, &kept[2], &seed_obj)) {
        name_the_error("saved");
        return NULL;
    }
    if (!seed_argument(seed_obj, &seed)) return NULL;
    module_call c = {.held = {NULL}};
    PyArrayObject *grad = NULL, *kept_views[3] = {NULL};
    PyObject *grads[5] = {NULL}, *result = NULL;
    if (!module_setup(&c, params, spec_obj, dtype_obj, p_obj, 1, scale_obj) ||
        !module_input(&c, x_obj, mask_obj, 0))
        goto done;
    npy_intp shape[NPY_MAXDIMS], kept_shape[3][2];
    static const char *kept_names[3] = {"qkv", "merged", "lse"};
    kept_shapes(&c, kept_shape);
    /* views of their own, which hold the memory's owners: the tuple's items
     * are borrowed, and grad_output's conversion (or another thread, while
     * the kernel runs) could otherwise resize them */
    for (int i = 0; i < 3; i++)
        if (!kept_array(kept[i], kept_names[i], i == 2 ? compute_dtype(c.dt) : c.dt, kept_shape[i]) ||
            !(kept_views[i] = (PyArrayObject *)PyArray_View((PyArrayObject *)kept[i], NULL, &PyArray_Type)))
            goto done;
    int nd = module_output_shape(&c, shape);
    if (!(grad = real_input(grad_obj, "grad_output", c.dt, 1)) || !check_shape(grad, "grad_output", nd, shape))
        goto done;
    attnc_self_attention_backward_args g = {
        .forward = c.s, .qkv = PyArray_DATA(kept_views[0]), .merged = PyArray_DATA(kept_views[1]),
        .lse = PyArray_DATA(kept_views[2]),
        .grad_out = PyArray_DATA(grad),
    };
    g.forward.seed = seed;
    npy_intp w_shape[2] = {kept_shape[0][1], c.spec.in_dim}, out_shape[2] = {c.spec.out_dim, c.spec.v_dim};
    int has_out = c.spec.out_dim >= 0, run = PyArray_SIZE(c.x) > 0 && PyArray_SIZE(grad) > 0;
    /* zeros where the kernel does not run (an empty x or grad_output); else
     * it writes every element (each gradient is a product's whole C) */
    if (!(grads[0] = new_array_of(PyArray_NDIM(c.x), PyArray_DIMS(c.x), c.dt, !run)) ||
        !(grads[1] = new_array_of(2, w_shape, c.dt, !run)) || !(grads[2] = new_array_of(1, w_shape, c.dt, !run)) ||
        (has_out && !(grads[3] = new_array_of(2, out_shape, c.dt, !run))) ||
        (has_out && !(grads[4] = new_array_of(1, out_shape, c.dt, !run))))
        goto done;
    g.grad_x = PyArray_DATA((PyArrayObject *)grads[0]);
    g.grad_w = PyArray_DATA((PyArrayObject *)grads[1]);
    g.grad_bias = PyArray_DATA((PyArrayObject *)grads[2]);
    g.grad_w_out = has_out ? PyArray_DATA((PyArrayObject *)grads[3]) : NULL;
    g.grad_bias_out = has_out ? PyArray_DATA((PyArrayObject *)grads[4]) : NULL;
    if (run) {
        attnc_status status;
        RUN_KERNEL(status, attnc_self_attention_backward(&g));
        if (!kernel_ok(status, "self_attention_backward")) goto done;
    }
    result = Py_BuildValue("(OOOOO)", grads[0], grads[1], grads[2], grads[3] ? grads[3] : Py_None,
                           grads[4] ? grads[4] : Py_None);
done:
    for (int i = 0; i < 5; i++) Py_XDECREF(grads[i]);
    for (int i = 0; i < 3; i++) Py_XDECREF(kept_views[i]);
    Py_XDECREF(grad);
    module_call_release(&c);
    return result;
}

/* ======================================================================== */
/* checks the modules' constructors share with the calls above              */

/* probability(p, name) -> float: p as a dropout probability, else
 * TypeError / ValueError naming `name` (the constructors' check). */
static PyObject *py_probability(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"p", "name", NULL};
    PyObject *p_obj;
    const char *name = "p";
    double p;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|s:probability", kwlist, &p_obj, &name)) return NULL;
    if (!probability(p_obj, name, &p)) return NULL;
    return PyFloat_FromDouble(p);
}

/* Whether commit can add `source` into `target` in place (add_into):
 * float32 or float64 arrays of one dtype (checked by the caller), in
 * native byte order, aligned, C-contiguous, and apart. */
static int addable(PyArrayObject *target, PyArrayObject *source)
{
    int type = PyArray_TYPE(target);
    if ((type != NPY_FLOAT && type != NPY_DOUBLE) || !PyArray_ISCARRAY_RO(target) || !PyArray_ISCARRAY_RO(source) ||
        !PyArray_ISNOTSWAPPED(target) || !PyArray_ISNOTSWAPPED(source))
        return 0;
    const char *t = PyArray_BYTES(target), *s = PyArray_BYTES(source);
    npy_intp bytes = PyArray_NBYTES(target);
    return t + bytes <= s || s + bytes <= t;
}

/* target (n elements) <- target + source, two addable arrays of
 * type_num: IEEE additions, as NumPy's add rounds them, in a loop that
 * neither calls NumPy nor reads the floating-point flags (an overflow is
 * inf, with no warning or error to raise once some targets are written);
 * the GIL let go for a long one, as NumPy's loops do. */
static void add_into(char *target, const char *source, npy_intp n, int type_num)
{
    if (type_num == NPY_FLOAT) {
        float *t = (float *)target;
        const float *s = (const float *)source;
        for (npy_intp i = 0; i < n; i++) t[i] = t[i] + s[i];
    } else {
        double *t = (double *)target;
        const double *s = (const double *)source;
        for (npy_intp i = 0; i < n; i++) t[i] = t[i] + s[i];
    }
}

/* commit(targets, sources, assignments, adds=None) -> None: each target
 * array <- its source (same shape and dtype, checked for all first), or,
 * where adds[i] is true, <- target + source (add_into: a gradient added
 * into its buffer, `buffer += grad`, the sum written nowhere else first),
 * then each (owner, attr, value) of assignments set (object.__setattr__),
 * all in one call: no Python signal handler runs in between (the eval
 * loop runs them between bytecodes), so a KeyboardInterrupt comes before
 * every copy or after the last assignment. A backward adding its
 * gradients a buffer at a time in Python, a Ctrl-C between two left some
 * added and the forward's state kept (the retried backward added those
 * twice); load_state_dict left some parameters loaded. */
static PyObject *py_commit(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"targets", "sources", "assignments", "adds", NULL};
    PyObject *target_list, *source_list, *assignment_list, *add_list = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!O!O!|O:commit", kwlist, &PyList_Type, &target_list,
                                     &PyList_Type, &source_list, &PyList_Type, &assignment_list, &add_list))
        return NULL;
    if (add_list != Py_None && !PyList_Check(add_list)) {
        PyErr_SetString(PyExc_TypeError, "commit: adds must be a list of bools or None");
        return NULL;
    }
    /* tuples of their own: a copy runs other code (an object array's
     * __del__; another thread, while NumPy's copy lets the GIL go) that
     * could change the lists and free their items */
    PyObject *targets = PyList_AsTuple(target_list), *sources = targets ? PyList_AsTuple(source_list) : NULL,
             *assignments = sources ? PyList_AsTuple(assignment_list) : NULL,
             *adds = !assignments ? NULL : add_list == Py_None ? PyTuple_New(0) : PyList_AsTuple(add_list),
             *result = NULL;
    if (!adds) goto done;
    Py_ssize_t n = PyTuple_GET_SIZE(targets);
    if (PyTuple_GET_SIZE(sources) != n) {
        PyErr_Format(PyExc_ValueError, "commit: %zd targets, %zd sources", n, PyTuple_GET_SIZE(sources));
        goto done;
    }
    if (add_list != Py_None && PyTuple_GET_SIZE(adds) != n) {
        PyErr_Format(PyExc_ValueError, "commit: %zd targets, %zd adds", n, PyTuple_GET_SIZE(adds));
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = PyTuple_GET_ITEM(targets, i), *s = PyTuple_GET_ITEM(sources, i);
        if (!PyArray_Check(t) || !PyArray_Check(s) || !PyArray_ISWRITEABLE((PyArrayObject *)t) ||
            !PyArray_SAMESHAPE((PyArrayObject *)t, (PyArrayObject *)s) ||
            !PyArray_EquivTypes(PyArray_DESCR((PyArrayObject *)t), PyArray_DESCR((PyArrayObject *)s))) {
            PyErr_Format(PyExc_ValueError, "commit: item %zd is not a writable array and a source of its shape "
                         "and dtype", i);
            goto done;
        }
        if (PyTuple_GET_SIZE(adds) && PyTuple_GET_ITEM(adds, i) != Py_False) {
            if (PyTuple_GET_ITEM(adds, i) != Py_True) {
                PyErr_Format(PyExc_TypeError, "commit: adds[%zd] is not a bool", i);
                goto done;
            }
            if (!addable((PyArrayObject *)t, (PyArrayObject *)s)) {
                PyErr_Format(PyExc_ValueError, "commit: item %zd, an add, is not two float32 or float64 arrays, "
                             "native, aligned, C-contiguous and apart", i);
                goto done;
            }
        }
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(assignments); i++) {
        PyObject *a = PyTuple_GET_ITEM(assignments, i);
        if (!PyTuple_Check(a) || PyTuple_GET_SIZE(a) != 3 || !PyUnicode_Check(PyTuple_GET_ITEM(a, 1))) {
            PyErr_Format(PyExc_ValueError, "commit: assignment %zd is not a tuple (owner, attr, value)", i);
            goto done;
        }
        if (PyType_Check(PyTuple_GET_ITEM(a, 0))) { /* a class's dict written past type.__setattr__ leaves
                                                      * CPython's attribute cache pointing at the freed value */
            PyErr_Format(PyExc_TypeError, "commit: assignment %zd sets an attribute of a class; the owners are "
                         "module instances", i);
            goto done;
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) { /* (arrays of one shape and dtype: failures not expected) */
        PyObject *t = PyTuple_GET_ITEM(targets, i), *s = PyTuple_GET_ITEM(sources, i);
        if (PyTuple_GET_SIZE(adds) && PyTuple_GET_ITEM(adds, i) == Py_True) {
            char *target = PyArray_BYTES((PyArrayObject *)t);
            const char *source = PyArray_BYTES((PyArrayObject *)s);
            npy_intp size = PyArray_SIZE((PyArrayObject *)t);
            int type = PyArray_TYPE((PyArrayObject *)t);
            NPY_BEGIN_THREADS_DEF;
            NPY_BEGIN_THREADS_THRESHOLDED(size); /* (NumPy's rule: not for a bias's few hundred) */
            add_into(target, source, size, type);
            NPY_END_THREADS;
        } else if (PyArray_CopyInto((PyArrayObject *)t, (PyArrayObject *)s) < 0) {
            goto done;
        }
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(assignments); i++) {
        PyObject *a = PyTuple_GET_ITEM(assignments, i);
        if (PyObject_GenericSetAttr(PyTuple_GET_ITEM(a, 0), PyTuple_GET_ITEM(a, 1), PyTuple_GET_ITEM(a, 2)) < 0)
            goto done;
    }
    result = Py_None;
    Py_INCREF(result);
done:
    Py_XDECREF(targets);
    Py_XDECREF(sources);
    Py_XDECREF(assignments);
    Py_XDECREF(adds);
    return result;
}

/* ======================================================================== */
/* update(param, grad, state_arrays, rule, state, entries, *, settings)    */

/* An array of the update: arr itself when aligned, native and
 * C-contiguous, else a copy that is (to be written back if the update
 * writes it); NULL with ValueError naming it unless it has `shape` (nd
 * dims) and the dtype dt (in either byte order). */
static PyArrayObject *update_operand(PyObject *obj, const char *name, attnc_dtype dt, int nd, const npy_intp *shape,
                                     int written)
{
    PyArrayObject *arr = (PyArrayObject *)obj;
    if (!PyArray_Check(obj) || !holds_dtype(arr, dt) || PyArray_NDIM(arr) != nd ||
        !PyArray_CompareLists(PyArray_DIMS(arr), shape, nd) ||
        (written && !PyArray_ISWRITEABLE(arr))) {
        PyErr_Format(PyExc_ValueError, "%s: expected a%s array of the parameter's shape and the update's dtype", name,
                     written ? " writable" : "n");
        return NULL;
    }
    PyArray_Descr *descr = dtype_descr(dt);
    return descr ? cast(arr, descr, 1) : NULL;
}

/* update(param, grad, state_arrays, rule, state, entries, *, start=False,
 * lr=0, momentum=0, weight_decay=0, decay=1, lerp_weight=0, beta2=0,
 * step_size=0, bias2_sqrt=1, eps=0) -> None:
 * one optimizer step of one parameter (attnc_update_args), in place, then
 * state.update(entries), in one call: a Ctrl-C during it comes after the
 * parameter, its state arrays and its entries are all updated (never
 * between two of them), where NumPy's operations one by one were each a
 * point to stop at. An array not aligned, native and C-contiguous is
 * updated in a copy written back (and then every written array is).
 * attnc/optim.py checks everything first; the checks here only keep the
 * kernel's memory safe. */
static PyObject *py_update(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"param", "grad", "state_arrays", "rule", "state", "entries", "start", "lr", "momentum",
                             "weight_decay", "decay", "lerp_weight", "beta2", "step_size", "bias2_sqrt", "eps",
                             NULL};
    PyObject *param_obj, *grad_obj, *arrays_obj, *state, *entries;
    const char *rule;
    int start = 0;
    attnc_update_args u = {.decay = 1, .bias2_sqrt = 1};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO!sO!O!|$pddddddddd:update", kwlist, &param_obj, &grad_obj,
                                     &PyTuple_Type, &arrays_obj, &rule, &PyDict_Type, &state, &PyDict_Type, &entries,
                                     &start, &u.lr, &u.momentum, &u.weight_decay, &u.decay, &u.lerp_weight, &u.beta2,
                                     &u.step_size, &u.bias2_sqrt, &u.eps))
        return NULL;
    int n_arrays = (int)PyTuple_GET_SIZE(arrays_obj), adamw = strcmp(rule, "adamw") == 0;
    if (adamw ? n_arrays != 2 : strcmp(rule, "sgd") != 0 || n_arrays > 1) {
        PyErr_Format(PyExc_ValueError, "rule: expected 'sgd' with 0 or 1 state arrays or 'adamw' with 2, got '%s' "
                     "with %d", rule, n_arrays);
        return NULL;
    }
    u.rule = adamw ? ATTNC_ADAMW : ATTNC_SGD;
    u.start = start;
    attnc_dtype dt = ATTNC_N_DTYPES;
    for (int d = 0; d < ATTNC_N_DTYPES && PyArray_Check(param_obj); d++)
        if (holds_dtype((PyArrayObject *)param_obj, (attnc_dtype)d)) dt = (attnc_dtype)d;
    if (dt == ATTNC_N_DTYPES) {
        PyErr_SetString(PyExc_ValueError, "param: expected a float16, bfloat16, float32 or float64 array");
        return NULL;
    }
    PyArrayObject *given[4] = {(PyArrayObject *)param_obj, (PyArrayObject *)grad_obj}, *used[4] = {NULL};
    static const char *names[4] = {"param", "grad", "state_arrays[0]", "state_arrays[1]"};
    int n = 2 + n_arrays, nd = PyArray_NDIM(given[0]), copied = 0;
    PyObject *result = NULL;
    for (int i = 2; i < n; i++) given[i] = (PyArrayObject *)PyTuple_GET_ITEM(arrays_obj, i - 2);
    for (int i = 0; i < n; i++) {
        used[i] = update_operand((PyObject *)given[i], names[i], i < 2 ? dt : compute_dtype(dt), nd,
                                 PyArray_DIMS(given[0]), i != 1);
        if (!used[i]) goto done;
        copied |= i != 1 && used[i] != given[i];
    }
    /* With one written array copied, all are (grad, read only, is never
     * one to write): the update then changes nothing of the caller's until
     * every write-back is known to go through (a signal handler run by a
     * copy, or another thread, may have made an array read-only since it
     * was checked), and never only some of them. */
    for (int i = 0; i < n && copied; i++) {
        if (i == 1 || used[i] != given[i]) continue;
        Py_SETREF(used[i], (PyArrayObject *)PyArray_NewCopy(given[i], NPY_CORDER));
        if (!used[i]) goto done;
    }
    u.param = PyArray_DATA(used[0]);
    u.grad = PyArray_DATA(used[1]);
    for (int i = 2; i < n; i++) u.state[i - 2] = PyArray_DATA(used[i]);
    u.n = PyArray_SIZE(used[0]);
    attnc_status status;
    RUN_KERNEL_POLLED_BY(status, attnc_kernels_for(dt)->update(&u), run_to_the_end);
    if (!kernel_ok(status, "update")) goto done;
    for (int i = 0; i < n && copied; i++)
        if (i != 1 && !PyArray_ISWRITEABLE(given[i])) {
            PyErr_Format(PyExc_ValueError, "%s: made read-only during the update, which then changed nothing",
                         names[i]);
            goto done;
        }
    for (int i = 0; i < n && copied; i++)
        if (i != 1 && PyArray_CopyInto(given[i], used[i]) < 0) goto done; /* (same shape and dtype: not expected) */
    if (PyDict_Update(state, entries) < 0) goto done;
    result = Py_None;
    Py_INCREF(result);
done:
    for (int i = 0; i < n; i++) Py_XDECREF(used[i]);
    return result;
}

/* check_rng(rng) -> rng: a numpy.random.Generator or None, else TypeError. */
static PyObject *py_check_rng(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"rng", NULL};
    PyObject *rng;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O:check_rng", kwlist, &rng) || !check_rng(rng)) return NULL;
    Py_INCREF(rng);
    return rng;
}

/* as_parameter(value, *, name, dtype) -> an aligned, writable,
 * C-contiguous base-class ndarray of dtype: value itself when it already
 * is one, else a converted copy. TypeError naming `name` for non-real data. */
static PyObject *py_as_parameter(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"value", "name", "dtype", NULL};
    PyObject *value, *dtype_obj;
    const char *name;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O$sO:as_parameter", kwlist, &value, &name, &dtype_obj))
        return NULL;
    attnc_dtype dt;
    int given;
    if (!dtype_argument(dtype_obj, &given, &dt)) return NULL;
    if (!given) return PyErr_Format(PyExc_TypeError, "dtype: expected float16, bfloat16, float32 or float64, got None");
    PyArrayObject *arr = real_values(value, name); /* a parameter is the value itself when it can be */
    if (!arr) return NULL;
    int flags = NPY_ARRAY_CARRAY | NPY_ARRAY_NOTSWAPPED | NPY_ARRAY_FORCECAST | NPY_ARRAY_ENSUREARRAY;
    PyArray_Descr *descr = dtype_descr(dt);
    /* (copy_as: NumPy's conversion took 3.2 s to stop assigning a float64 (16384,
     * 16384) value to a float32 weight; a Ctrl-C audit, 2026-12-07) */
    PyObject *param = descr ? (PyObject *)copy_as(arr, descr, flags) : NULL;
    Py_DECREF(arr);
    if (!param) name_the_error(name);
    return param;
}

/* copy(array) -> array.copy() (C-contiguous, a base-class ndarray), made by
 * copy_as: a block at a time, Ctrl-C asked about between (NumPy's own
 * copy polls nothing: a module's state_dict() of 1 GiB stopped 0.94 s after
 * Ctrl-C, a training forward's private copy of a 1 GiB mask 1.8 s). */
static PyObject *py_copy(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"array", NULL};
    PyObject *obj;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O:copy", kwlist, &obj)) return NULL;
    if (!PyArray_Check(obj))
        return PyErr_Format(PyExc_TypeError, "array: expected a numpy.ndarray, got %s", Py_TYPE(obj)->tp_name);
    PyArray_Descr *descr = PyArray_DESCR((PyArrayObject *)obj);
    Py_INCREF(descr);
    return (PyObject *)copy_as((PyArrayObject *)obj, descr,
                               NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ENSURECOPY | NPY_ARRAY_ENSUREARRAY);
}

/* result_dtype(**arrays) -> the functional layer's result dtype of the
 * arrays given by name (result_dtype above); TypeError naming an array of
 * another kind. */
static PyObject *py_result_dtype(PyObject *self, PyObject *args, PyObject *kwargs)
{
    /* (key, value) pairs of their own: an argument's __array__ could change
     * the dict being walked, and free a name or an array still to come */
    PyObject *items = kwargs ? PyDict_Items(kwargs) : PyList_New(0), *pairs = items ? PyList_AsTuple(items) : NULL;
    Py_XDECREF(items);
    if (!pairs) return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(pairs), i = 0;
    PyArrayObject *arrays[8] = {NULL};
    PyObject *result = NULL;
    if (PyTuple_GET_SIZE(args) != 0 || n > 8) {
        PyErr_Format(PyExc_TypeError, "result_dtype: expected at most 8 arrays, by name");
        goto done;
    }
    for (i = 0; i < n; i++) {
        PyObject *pair = PyTuple_GET_ITEM(pairs, i);
        const char *name = PyUnicode_AsUTF8(PyTuple_GET_ITEM(pair, 0));
        if (!name || !(arrays[i] = real_values(PyTuple_GET_ITEM(pair, 1), name))) goto done;
    }
    result = (PyObject *)dtype_descr(result_dtype(arrays, (int)n));
done:
    for (i = 0; i < n && i < 8; i++) Py_XDECREF(arrays[i]);
    Py_DECREF(pairs);
    return result;
}

/* ======================================================================== */
/* threads, kernel levels, test hooks                                       */

/* The integer `obj`, argument `name`, in [low, high]; a TypeError or
 * ValueError naming it otherwise. */
static int long_in_range(PyObject *obj, const char *name, long low, long high, long *out)
{
    int overflow;
    if (!as_long(obj, name, out, &overflow)) return 0;
    if (!overflow && *out >= low && *out <= high) return 1;
    PyErr_Format(PyExc_ValueError, "%s: expected an integer from %ld to %ld, got %R", name, low, high, obj);
    return 0;
}

/* The one integer argument `name` of `function`, in [low, high]. */
static int bounded_long_argument(PyObject *args, PyObject *kwargs, const char *function, char *name, long low,
                                 long high, long *out)
{
    char *kwlist[] = {name, NULL};
    char format[64];
    PyObject *obj;
    snprintf(format, sizeof format, "O:%s", function); /* errors of the call itself name the function */
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, format, kwlist, &obj)) return 0;
    return long_in_range(obj, name, low, high, out);
}

static PyObject *py_set_num_threads(PyObject *self, PyObject *args, PyObject *kwargs)
{
    long n;
    if (!bounded_long_argument(args, kwargs, "set_num_threads", "n", 1, INT_MAX, &n)) return NULL;
    attnc_set_num_threads((int)n);
    Py_RETURN_NONE;
}

static PyObject *py_get_num_threads(PyObject *self, PyObject *unused)
{
    return PyLong_FromLong(attnc_get_num_threads());
}

static PyObject *py_simd_levels(PyObject *self, PyObject *unused)
{
    int n = attnc_n_levels();
    PyObject *levels = PyTuple_New(n);
    for (int i = 0; levels && i < n; i++) {
        PyObject *name = PyUnicode_FromString(attnc_level_name(i));
        if (!name) Py_CLEAR(levels);
        else PyTuple_SET_ITEM(levels, i, name);
    }
    return levels;
}

static PyObject *py_set_simd_level(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"level", NULL};
    PyObject *level;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O:set_simd_level", kwlist, &level)) return NULL;
    if (!PyUnicode_Check(level))
        return PyErr_Format(PyExc_TypeError, "level: expected a str, got %s", Py_TYPE(level)->tp_name);
    Py_ssize_t size;
    const char *name = PyUnicode_AsUTF8AndSize(level, &size);
    if (!name) return NULL;
    if ((size_t)size == strlen(name) && attnc_set_level(name)) Py_RETURN_NONE; /* (no NUL cutting it short) */
    PyObject *levels = py_simd_levels(self, NULL);
    if (levels) PyErr_Format(PyExc_ValueError, "level: %R is not a level this CPU runs; it runs %R", level, levels);
    Py_XDECREF(levels);
    return NULL;
}

static PyObject *py_simd_level(PyObject *self, PyObject *unused)
{
    return PyUnicode_FromString(attnc_active_level());
}

static PyObject *py_l1d_ways(PyObject *self, PyObject *unused) { return PyLong_FromLong(attnc_l1d_ways()); }

static PyObject *py_simd_vector_bytes(PyObject *self, PyObject *unused)
{
    return PyLong_FromLong(attnc_kernels_for(ATTNC_F32)->vector_bytes);
}

static PyObject *py_cpu_is_intel(PyObject *self, PyObject *unused) { return PyBool_FromLong(attnc_cpu_is_intel()); }

static PyObject *py_last_gemm_order(PyObject *self, PyObject *unused)
{
    return PyUnicode_FromString(attnc_gemm_order_names[attnc_last_gemm_order()]);
}

static PyObject *py_set_l1d_ways(PyObject *self, PyObject *args, PyObject *kwargs)
{
    long ways;
    if (!bounded_long_argument(args, kwargs, "set_l1d_ways", "ways", 0, ATTNC_MAX_L1D_WAYS, &ways)) return NULL;
    attnc_set_l1d_ways((int)ways);
    Py_RETURN_NONE;
}

#define ATTNC_MAX_CPUS_FOR_TESTS 64 /* more threads than a test would ask for */

static PyObject *py_set_cpus_for_tests(PyObject *self, PyObject *args, PyObject *kwargs)
{
    long n;
    if (!bounded_long_argument(args, kwargs, "set_cpus_for_tests", "n", 0, ATTNC_MAX_CPUS_FOR_TESTS, &n)) return NULL;
    attnc_set_cpus_for_tests((int)n);
    Py_RETURN_NONE;
}

static PyObject *py_fail_alloc_after(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"n", "once", NULL};
    PyObject *obj;
    int once = 0;
    long n;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|$p:fail_alloc_after", kwlist, &obj, &once)) return NULL;
    if (!long_in_range(obj, "n", LONG_MIN, LONG_MAX, &n)) return NULL;
    return PyLong_FromLong(attnc_fail_alloc_after(n, once));
}

/* ======================================================================== */
/* the module                                                               */

#define KW (METH_VARARGS | METH_KEYWORDS)
#define FN(f) ((PyCFunction)(void (*)(void))(f))

static PyMethodDef methods[] = {
    {"linear", FN(py_linear), KW,
     "linear($module, /, x, weight, bias=None, *, dtype=None)\n--\n\n"
     "x @ weight.T + bias; dtype None: the functional dtype rule."},
    {"softmax", FN(py_softmax), KW,
     "softmax($module, /, x, axis=-1, *, dtype=None)\n--\n\nStable softmax along axis."},
    {"dropout", FN(py_dropout), KW,
     "dropout($module, /, x, p=0.5, *, training=True, rng=None, dtype=None, seed=None)\n--\n\n"
     "x with each element zeroed with probability p and the rest scaled by 1/(1-p) (training), or a copy; "
     "seed: the mask's key (None: drawn from rng)."},
    {"scaled_dot_product_attention", FN(py_sdpa), KW,
     "scaled_dot_product_attention($module, /, query, key, value, attn_mask=None, dropout_p=0.0, "
     "is_causal=False, scale=None, rng=None, return_weights=False, return_lse=False, attn_bias=None, "
     "causal_alignment='top_left', window=None, dtype=None, seed=None)\n--\n\n"
     "attnc.functional.scaled_dot_product_attention; dtype None: the functional dtype rule; seed: the dropout "
     "mask's key (None: drawn from rng)."},
    {"scaled_dot_product_attention_backward", FN(py_sdpa_backward), KW,
     "scaled_dot_product_attention_backward($module, /, grad_out, query, key, value, out, lse, attn_mask=None, "
     "is_causal=False, scale=None, dropout_p=0.0, *, attn_bias=None, causal_alignment='top_left', window=None, "
     "dtype=None, seed=None)\n--\n\n"
     "The gradients of query, key and value in their shapes (summed over the axes each is broadcast over); "
     "dropout needs the forward's seed."},
    {"self_attention", FN(py_self_attention), KW,
     "self_attention($module, /, x, params, spec, attention_mask, dtype, dropout_p=0.0, training=False, "
     "rng=None, return_weights=False, scale=None, save=False, packed=None)\n--\n\n"
     "A whole module forward. params: the parameter arrays in the order of spec's names; spec: "
     "(names, dropout_name, (in_dim, qk_dim, v_dim, out_dim), n_heads, heads_axis, fused), built at the "
     "module's construction (heads_axis: the weights and mask have a heads axis, needed when n_heads > 1). scale None: 1/sqrt(qk_dim // n_heads). save: also return what the backward needs, "
     "as (result, saved). packed: what freeze_module returned for these params (else ignored)."},
    {"freeze_module", FN(py_freeze_module), KW,
     "freeze_module($module, /, params, spec, dtype)\n--\n\n"
     "(frozen params, packed): read-only copies of params that cannot be made writable, and their projection "
     "weights packed once for self_attention's `packed`."},
    {"read_only_copy", FN(py_read_only_copy), KW,
     "read_only_copy($module, /, array, dtype, name='array')\n--\n\n"
     "array in dtype as a C-contiguous copy that cannot be made writable (as freeze_module's copies); "
     "TypeError or ValueError naming `name` for an array that is not real."},
    {"self_attention_backward", FN(py_self_attention_backward), KW,
     "self_attention_backward($module, /, grad_output, saved, params, spec, attention_mask=None, *, dtype, "
     "dropout_p=0.0, scale=None)\n--\n\n"
     "A whole module backward from what self_attention(..., save=True) kept: (grad_x, grad_w (the Q, K, V "
     "weights' gradients stacked), grad_bias (stacked), grad_w_out or None, grad_bias_out or None)."},
    {"probability", FN(py_probability), KW,
     "probability($module, /, p, name='p')\n--\n\np as a float in [0, 1], else TypeError/ValueError naming name."},
    {"update", FN(py_update), KW,
     "update($module, /, param, grad, state_arrays, rule, state, entries, *, start=False, lr=0, momentum=0, "
     "weight_decay=0, decay=1, lerp_weight=0, beta2=0, step_size=0, bias2_sqrt=1, eps=0)\n--\n\n"
     "One optimizer step of one parameter, in place, then state.update(entries), in one call."},
    {"commit", FN(py_commit), KW,
     "commit($module, /, targets, sources, assignments, adds=None)\n--\n\n"
     "Each target array <- its source (same shape and dtype), or target + source where adds[i] is True "
     "(float32 or float64 arrays, native, aligned, C-contiguous and apart), then each (owner, attr, value) of assignments set as object.__setattr__ sets "
     "it, with no Python signal handler run in between."},
    {"check_rng", FN(py_check_rng), KW,
     "check_rng($module, /, rng)\n--\n\nrng if it is a numpy.random.Generator or None, else TypeError."},
    {"as_parameter", FN(py_as_parameter), KW,
     "as_parameter($module, /, value, *, name, dtype)\n--\n\n"
     "value as an aligned, writable, C-contiguous ndarray of dtype (value itself if it already is one)."},
    {"copy", FN(py_copy), KW,
     "copy($module, /, array)\n--\n\n"
     "array.copy() of an ndarray (C-contiguous, base class), made a block at a time with Ctrl-C asked about "
     "between blocks."},
    {"result_dtype", FN(py_result_dtype), KW,
     "result_dtype($module, /, **arrays)\n--\n\n"
     "The dtype of a functional call's result for these inputs (see attnc.functional)."},
    {"set_num_threads", FN(py_set_num_threads), KW,
     "set_num_threads($module, /, n)\n--\n\n"
     "Set the number of threads the kernels may use.\n\n"
     "Results never depend on it: every kernel gives the same bits for any\n"
     "thread count. The pool never runs more threads than the CPUs this\n"
     "process may use.\n\n"
     "Parameters\n----------\n"
     "n : int\n    The thread count, >= 1.\n\n"
     "Raises\n------\n"
     "ValueError\n    For n < 1 or n > 2147483647, naming `n`.\n"
     "TypeError\n    For an `n` that is not an integer, naming `n`.\n\n"
     "See Also\n--------\nget_num_threads\n\n"
     "Examples\n--------\n"
     ">>> import attnc\n"
     ">>> before = attnc.get_num_threads()\n"
     ">>> attnc.set_num_threads(1)\n"
     ">>> attnc.get_num_threads()\n"
     "1\n"
     ">>> attnc.set_num_threads(before)\n"},
    {"get_num_threads", py_get_num_threads, METH_NOARGS,
     "get_num_threads($module, /)\n--\n\n"
     "The thread count the kernels may use.\n\n"
     "Returns\n-------\n"
     "int\n    The count last given to `set_num_threads`; by default the\n"
     "    number of CPUs this process may run on.\n\n"
     "See Also\n--------\nset_num_threads\n\n"
     "Examples\n--------\n"
     ">>> import attnc\n"
     ">>> attnc.get_num_threads() >= 1\n"
     "True\n"},
    {"simd_levels", py_simd_levels, METH_NOARGS,
     "simd_levels($module, /)\n--\n\nThe kernel ISA levels this CPU can run, best last."},
    {"set_simd_level", FN(py_set_simd_level), KW,
     "set_simd_level($module, /, level)\n--\n\nUse the kernels of at most `level` (one of simd_levels())."},
    {"simd_level", py_simd_level, METH_NOARGS, "simd_level($module, /)\n--\n\nThe kernel ISA level in use."},
    {"l1d_ways", py_l1d_ways, METH_NOARGS,
     "l1d_ways($module, /)\n--\n\nThe ways of a set of this CPU's L1 data cache as the GEMM counts them (0: unknown)."},
    {"set_l1d_ways", FN(py_set_l1d_ways), KW,
     "set_l1d_ways($module, /, ways)\n--\n\nTesting hook: the GEMM counts `ways` ways (0: unknown), as on another CPU."},
    {"simd_vector_bytes", py_simd_vector_bytes, METH_NOARGS,
     "simd_vector_bytes($module, /)\n--\n\nThe vector width of the kernel level in use, in bytes (the GEMM's orders depend on it)."},
    {"cpu_is_intel", py_cpu_is_intel, METH_NOARGS,
     "cpu_is_intel($module, /)\n--\n\nWhether this CPU is Intel's (some of the GEMM's orders are chosen by it)."},
    {"last_gemm_order", py_last_gemm_order, METH_NOARGS,
     "last_gemm_order($module, /)\n--\n\nTesting hook: the order the last GEMM on this thread took: \"direct\",\n"
     "\"few_rows\", \"transposed\", \"streamed\", \"far_x\" or \"blocked\" (csrc/attnc.h)."},
    {"set_cpus_for_tests", FN(py_set_cpus_for_tests), KW,
     "set_cpus_for_tests($module, /, n)\n--\n\nTesting hook: run up to `n` threads (0: up to the real CPUs), so that\n"
     "`set_num_threads` counts up to `n` split the work as on a machine that wide (0 to 64);\n"
     "the default thread count stays the real CPUs'."},
    {"fail_alloc_after", FN(py_fail_alloc_after), KW,
     "fail_alloc_after($module, /, n, *, once=False)\n--\n\nTesting hook: the (n+1)-th kernel allocation fails, and "
     "every later one too unless once (n < 0: none fails). Returns the allocations that were "
     "left before a failure (-1 once a `once` failure has been made)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "attnc._C", .m_doc = "attnc's C kernels and their one validation layer",
    .m_size = -1, .m_methods = methods,
};

PyMODINIT_FUNC PyInit__C(void)
{
    import_array();
    if (!generator_type) {
        PyObject *random = PyImport_ImportModule("numpy.random");
        if (!random) return NULL;
        generator_type = PyObject_GetAttrString(random, "Generator");
        Py_DECREF(random);
        if (!generator_type) return NULL;
    }
    attnc_select_kernels();
    if (!kept_blocks_capsule &&
        !(kept_blocks_capsule = PyCapsule_New(&kept_blocks_handler, "mem_handler", NULL)))
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddIntConstant(m, "GEMM_KC", ATTNC_GEMM_KC) < 0) Py_CLEAR(m);
    if (m && PyModule_AddIntConstant(m, "MAX_L1D_WAYS", ATTNC_MAX_L1D_WAYS) < 0) Py_CLEAR(m);
    return m;
}
