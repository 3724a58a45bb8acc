/* The Ray adapter's op path in C (ops.py keeps the same logic in Python where this extension
 * was not built, and says what each step is for).
 *
 * Why C: every measured Ray op runs dpobs's code between Ray's own calls, where nothing of it
 * is in the CPU's caches, and each Python-level call of it then costs about half a
 * microsecond (docs/development/performance.md, "Ray's object store"). Here the serializer
 * hooks and the op's timing are a few C calls each. What stays in Python: the public ops'
 * own functions (they must stay functions: `inspect.isfunction(ray.get)`), each op's record
 * maker, and every path off the common one (a failed op, a worker's side of a task).
 *
 *   Frame()                      what Ray's serializer did for one op: op, skip, count,
 *                                nbytes, seconds (ops.Frame's fields)
 *   Op(fn, op, per_process, unbuilt, entry, failed, on_error, local, drain_at,
 *      skip=None, started=-1.0)  a callable: fn measured as ops.Patches.measured measures it
 *   Hook(kind, fn, local, dummy, outside, on_error, size_fields)
 *                                a method (binds like a function): Ray's serializer (kind 0)
 *                                or deserializer (kind 1), feeding the open frame; a
 *                                serialized object's size is read from size_fields (Ray's
 *                                private names, spelled in shims/ray_private.py)
 *   now(), plant(name)           the clock; a size reader made to raise (tests)
 *
 * Errors of the wrapped function propagate unchanged; dpobs's own are passed to on_error
 * (counted there) and the call goes on.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <string.h>
#include <time.h>

static PyObject *s_current, *s_adapter, *s_frame, *s_pending, *s_drain;
/* A size reader made to raise on purpose (plant()): the invisibility tests break each dpobs
 * component on an op's path, and these two have no Python name to replace here. */
enum { PLANT_NONE, PLANT_OBJECT_SIZE, PLANT_STORED_SIZE };
static int planted = PLANT_NONE;

static int planted_error(int which, const char *name) {
    if (planted != which)
        return 0;
    PyErr_Format(PyExc_RuntimeError, "%s raises on purpose (plant())", name);
    return -1;
}

static double now(void) {
    /* time.perf_counter()'s clock on Linux: a `started` taken in Python compares with it */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* dpobs's own failure (the error set now): handed to on_error and cleared. Anything not an
 * Exception (KeyboardInterrupt, SystemExit) is left set, as Python's `except Exception`
 * would leave it: returns -1 then. */
static int report(PyObject *on_error) {
    if (!PyErr_ExceptionMatches(PyExc_Exception))
        return -1;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (value != NULL) {
        PyObject *r = PyObject_CallOneArg(on_error, value);
        if (r == NULL)
            PyErr_Clear();
        Py_XDECREF(r);
    }
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    return 0;
}

/* Each slot takes a new reference to its object (an __init__ called again drops the old). */
static void hold(PyObject **slots[], PyObject *held[], size_t n) {
    for (size_t i = 0; i < n; i++) {
        Py_INCREF(held[i]);
        Py_XSETREF(*slots[i], held[i]);
    }
}

/* -- Frame ---------------------------------------------------------------------------------- */
typedef struct {
    PyObject_HEAD
    PyObject *op;   /* NULL or None: a call that is not a measured op (an actor's creation) */
    PyObject *skip; /* a set of the ids of objects that are not the op's, or NULL */
    Py_ssize_t count;
    long long nbytes;
    double seconds;
} Frame;

static void frame_dealloc(Frame *self) {
    Py_XDECREF(self->op);
    Py_XDECREF(self->skip);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef frame_members[] = {
    {"op", T_OBJECT, offsetof(Frame, op), 0, NULL},
    {"skip", T_OBJECT, offsetof(Frame, skip), 0, NULL},
    {"count", T_PYSSIZET, offsetof(Frame, count), 0, NULL},
    {"nbytes", T_LONGLONG, offsetof(Frame, nbytes), 0, NULL},
    {"seconds", T_DOUBLE, offsetof(Frame, seconds), 0, NULL},
    {NULL}};

static PyTypeObject FrameType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dpobs_otel.adapters.ray._fast.Frame",
    .tp_basicsize = sizeof(Frame),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "What Ray's serializer did for one op on this thread.",
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)frame_dealloc,
    .tp_members = frame_members,
};

static Frame *new_frame(PyObject *op, PyObject *skip) {
    Frame *f = (Frame *)PyType_GenericNew(&FrameType, NULL, NULL);
    if (f == NULL)
        return NULL;
    Py_XINCREF(op);
    f->op = op;
    if (skip != NULL && skip != Py_None) {
        Py_INCREF(skip);
        f->skip = skip;
    }
    return f;
}

/* The thread's open frame (a new reference: None where none is open). */
static PyObject *open_frame(PyObject *local) {
    PyObject *frame = PyObject_GetAttr(local, s_frame);
    if (frame == NULL && PyErr_ExceptionMatches(PyExc_AttributeError)) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    return frame;
}

/* -- Op ------------------------------------------------------------------------------------- */
typedef struct {
    PyObject_HEAD
    PyObject *fn, *op, *per_process, *unbuilt, *entry, *failed, *on_error, *local, *skip;
    Py_ssize_t drain_at;
    double started;
} Op;

static int op_traverse(Op *self, visitproc visit, void *arg) {
    Py_VISIT(self->fn); Py_VISIT(self->op); Py_VISIT(self->per_process);
    Py_VISIT(self->unbuilt); Py_VISIT(self->entry); Py_VISIT(self->failed);
    Py_VISIT(self->on_error); Py_VISIT(self->local); Py_VISIT(self->skip);
    return 0;
}

static int op_clear(Op *self) {
    Py_CLEAR(self->fn); Py_CLEAR(self->op); Py_CLEAR(self->per_process);
    Py_CLEAR(self->unbuilt); Py_CLEAR(self->entry); Py_CLEAR(self->failed);
    Py_CLEAR(self->on_error); Py_CLEAR(self->local); Py_CLEAR(self->skip);
    return 0;
}

static void op_dealloc(Op *self) {
    PyObject_GC_UnTrack(self);
    op_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int op_init(Op *self, PyObject *args, PyObject *kwargs) {
    static char *kw[] = {"fn", "op", "per_process", "unbuilt", "entry", "failed", "on_error",
                         "local", "drain_at", "skip", "started", NULL};
    PyObject *fn, *op, *pp, *unbuilt, *entry, *failed, *on_error, *local, *skip = Py_None;
    Py_ssize_t drain_at;
    double started = -1.0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOOOOn|Od", kw, &fn, &op, &pp,
                                     &unbuilt, &entry, &failed, &on_error, &local, &drain_at,
                                     &skip, &started))
        return -1;
    PyObject *held[] = {fn, op, pp, unbuilt, entry, failed, on_error, local, skip};
    PyObject **slots[] = {&self->fn, &self->op, &self->per_process, &self->unbuilt,
                          &self->entry, &self->failed, &self->on_error, &self->local,
                          &self->skip};
    hold(slots, held, sizeof held / sizeof *held);
    self->drain_at = drain_at;
    self->started = started;
    return 0;
}

/* The meter of this process (a new reference; None: dpobs is off), or NULL on dpobs's own
 * failure (reported). */
static PyObject *op_meter(Op *self) {
    PyObject *meter = PyObject_GetAttr(self->per_process, s_current);
    if (meter == self->unbuilt) {
        Py_DECREF(meter);
        meter = PyObject_CallMethodNoArgs(self->per_process, s_adapter);
    }
    return meter;
}

/* After the op returned: its record (entry's) appended to the meter's pending list. */
static int op_record(Op *self, PyObject *meter, PyObject *result, double dt, Frame *frame,
                     PyObject *args, PyObject *kwargs) {
    PyObject *pending = NULL, *record = NULL, *r;
    int rc = -1;
    PyObject *dt_obj = PyFloat_FromDouble(dt);
    if (dt_obj == NULL)
        goto done;
    record = PyObject_CallFunctionObjArgs(self->entry, meter, result, dt_obj, frame, args,
                                          kwargs, NULL);
    if (record == NULL || (pending = PyObject_GetAttr(meter, s_pending)) == NULL)
        goto done;
    if (PyList_Append(pending, record) < 0)
        goto done;
    if (PyList_GET_SIZE(pending) >= self->drain_at) {
        if ((r = PyObject_CallMethodNoArgs(meter, s_drain)) == NULL)
            goto done;
        Py_DECREF(r);
    }
    rc = 0;
done:
    Py_XDECREF(dt_obj);
    Py_XDECREF(record);
    Py_XDECREF(pending);
    return rc;
}

static PyObject *op_call(Op *self, PyObject *args, PyObject *kwargs) {
    PyObject *meter = op_meter(self);
    if (meter == NULL && report(self->on_error) < 0)
        return NULL;
    if (meter == NULL || meter == Py_None) {
        Py_XDECREF(meter);
        return PyObject_Call(self->fn, args, kwargs);
    }
    PyObject *outer = NULL, *kw = NULL, *result;
    Frame *frame = new_frame(self->op, self->skip);
    if (frame == NULL || (outer = open_frame(self->local)) == NULL
            || PyObject_SetAttr(self->local, s_frame, (PyObject *)frame) < 0) {
        Py_XDECREF(frame);
        Py_XDECREF(outer);
        Py_DECREF(meter);
        if (report(self->on_error) < 0)
            return NULL;
        return PyObject_Call(self->fn, args, kwargs);
    }
    double t0 = self->started >= 0 ? self->started : now();
    result = PyObject_Call(self->fn, args, kwargs);
    double dt = now() - t0;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb); /* the op's own error, if any: kept aside, raised last */
    if (PyObject_SetAttr(self->local, s_frame, outer) < 0)
        PyErr_Clear();
    kw = kwargs != NULL ? (Py_INCREF(kwargs), kwargs) : PyDict_New();
    if (result == NULL) {
        PyErr_NormalizeException(&type, &value, &tb);
        if (tb != NULL)
            PyException_SetTraceback(value, tb);
        PyObject *dt_obj = PyFloat_FromDouble(dt);
        PyObject *r = (dt_obj == NULL || kw == NULL) ? NULL :
            PyObject_CallFunctionObjArgs(self->failed, meter, args, kw, dt_obj, frame, value,
                                         NULL);
        if (r == NULL)
            PyErr_Clear();
        Py_XDECREF(r);
        Py_XDECREF(dt_obj);
        PyErr_Restore(type, value, tb);
    } else if (kw == NULL || op_record(self, meter, result, dt, frame, args, kw) < 0) {
        if (report(self->on_error) < 0)
            Py_CLEAR(result);
    }
    Py_XDECREF(kw);
    Py_DECREF(outer);
    Py_DECREF(frame);
    Py_DECREF(meter);
    return result;
}

static PyTypeObject OpType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dpobs_otel.adapters.ray._fast.Op",
    .tp_basicsize = sizeof(Op),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A Ray op, measured: ops.Patches.measured's call, in C.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)op_init,
    .tp_dealloc = (destructor)op_dealloc,
    .tp_traverse = (traverseproc)op_traverse,
    .tp_clear = (inquiry)op_clear,
    .tp_call = (ternaryfunc)op_call,
};

/* -- Hook: Ray's serializer and deserializer ------------------------------------------------ */
enum { SERIALIZE = 0, DESERIALIZE = 1 };

typedef struct {
    PyObject_HEAD
    int kind;
    PyObject *fn, *local, *dummy, *outside, *on_error, *dict;
    PyObject *total_bytes, *metadata; /* the serialized object's size fields */
} Hook;

static int hook_traverse(Hook *self, visitproc visit, void *arg) {
    Py_VISIT(self->fn); Py_VISIT(self->local); Py_VISIT(self->dummy);
    Py_VISIT(self->outside); Py_VISIT(self->on_error); Py_VISIT(self->dict);
    Py_VISIT(self->total_bytes); Py_VISIT(self->metadata);
    return 0;
}

static int hook_clear(Hook *self) {
    Py_CLEAR(self->fn); Py_CLEAR(self->local); Py_CLEAR(self->dummy);
    Py_CLEAR(self->outside); Py_CLEAR(self->on_error); Py_CLEAR(self->dict);
    Py_CLEAR(self->total_bytes); Py_CLEAR(self->metadata);
    return 0;
}

static void hook_dealloc(Hook *self) {
    PyObject_GC_UnTrack(self);
    hook_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int hook_init(Hook *self, PyObject *args, PyObject *kwargs) {
    static char *kw[] = {"kind", "fn", "local", "dummy", "outside", "on_error", "size_fields",
                         NULL};
    PyObject *fn, *local, *dummy, *outside, *on_error, *total_bytes, *metadata;
    int kind;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iOOOOO(UU)", kw, &kind, &fn, &local,
                                     &dummy, &outside, &on_error, &total_bytes, &metadata))
        return -1;
    if (kind != SERIALIZE && kind != DESERIALIZE) {
        PyErr_SetString(PyExc_ValueError, "kind: 0 (serialize) or 1 (deserialize)");
        return -1;
    }
    self->kind = kind;
    PyObject *held[] = {fn, local, dummy, outside, on_error, total_bytes, metadata};
    PyObject **slots[] = {&self->fn, &self->local, &self->dummy, &self->outside,
                          &self->on_error, &self->total_bytes, &self->metadata};
    hold(slots, held, sizeof held / sizeof *held);
    return 0;
}

static long long as_size(PyObject *obj) { /* a new reference consumed; -1 on error */
    if (obj == NULL)
        return -1;
    long long n = PyLong_AsLongLong(obj);
    Py_DECREF(obj);
    return n;
}

/* Ray's object size of a serialized object: total_bytes plus its metadata's length. */
static long long object_size(Hook *self, PyObject *serialized) {
    if (planted_error(PLANT_OBJECT_SIZE, "object_size") < 0)
        return -1;
    long long total = as_size(PyObject_GetAttr(serialized, self->total_bytes));
    if (total < 0 && PyErr_Occurred())
        return -1;
    PyObject *meta = PyObject_GetAttr(serialized, self->metadata);
    if (meta == NULL)
        return -1;
    int truthy = PyObject_IsTrue(meta);
    Py_ssize_t n = truthy > 0 ? PyObject_Size(meta) : 0;
    Py_DECREF(meta);
    return (truthy < 0 || n < 0) ? -1 : total + n;
}

/* The same of each (data, metadata, ...) entry Worker.deserialize_objects is handed. */
static long long stored_sizes(PyObject *entries, Py_ssize_t *count) {
    if (planted_error(PLANT_STORED_SIZE, "stored_size") < 0)
        return -1;
    PyObject *seq = PySequence_Fast(entries, "deserialize_objects' entries");
    if (seq == NULL)
        return -1;
    long long total = 0;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    for (Py_ssize_t i = 0; i < n && total >= 0; i++) {
        PyObject *entry = PySequence_Fast_GET_ITEM(seq, i);
        for (Py_ssize_t part = 0; part < 2 && total >= 0; part++) {
            PyObject *item = PySequence_GetItem(entry, part);
            if (item == NULL) {
                total = -1;
                break;
            }
            int truthy = item == Py_None ? 0 : (part == 0 ? 1 : PyObject_IsTrue(item));
            Py_ssize_t len = truthy > 0 ? PyObject_Size(item) : 0;
            Py_DECREF(item);
            total = (truthy < 0 || len < 0) ? -1 : total + len;
        }
    }
    Py_DECREF(seq);
    *count = n;
    return total;
}

static int skipped(Frame *frame, PyObject *value) {
    if (frame->skip == NULL || !PyAnySet_Check(frame->skip) || PySet_GET_SIZE(frame->skip) == 0)
        return 0;
    PyObject *id = PyLong_FromVoidPtr(value);
    if (id == NULL)
        return -1;
    int found = PySet_Contains(frame->skip, id);
    Py_DECREF(id);
    return found;
}

/* Adds one serialization's objects, bytes and seconds to the open frame. */
static int feed(Hook *self, Frame *frame, PyObject *args, PyObject *out, double dt) {
    Py_ssize_t count = 1;
    long long size;
    if (self->kind == SERIALIZE) {
        PyObject *value = PyTuple_GET_SIZE(args) > 1 ? PyTuple_GET_ITEM(args, 1) : NULL;
        if (value == self->dummy)
            return 0;
        int skip = value != NULL ? skipped(frame, value) : 0;
        if (skip != 0)
            return skip;
        size = object_size(self, out);
    } else {
        if (PyTuple_GET_SIZE(args) < 2) {
            PyErr_SetString(PyExc_TypeError, "deserialize_objects: no serialized entries");
            return -1;
        }
        size = stored_sizes(PyTuple_GET_ITEM(args, 1), &count);
    }
    if (size < 0)
        return -1;
    frame->count += count;
    frame->nbytes += size;
    frame->seconds += dt;
    return 0;
}

static PyObject *hook_call(Hook *self, PyObject *args, PyObject *kwargs) {
    double t0 = now();
    PyObject *out = PyObject_Call(self->fn, args, kwargs);
    if (out == NULL)
        return NULL;
    double dt = now() - t0;
    int rc = 0;
    PyObject *frame = open_frame(self->local);
    if (frame == NULL) {
        rc = -1;
    } else if (Py_IS_TYPE(frame, &FrameType)) {
        Frame *f = (Frame *)frame;
        if (f->op != NULL && f->op != Py_None)
            rc = feed(self, f, args, out, dt);
    } else if (frame == Py_None) { /* a worker's side of a task, or an `await ref` */
        PyObject *r = PyObject_CallFunction(self->outside, "OOOd", args,
                                            kwargs != NULL ? kwargs : Py_None, out, dt);
        rc = r == NULL ? -1 : 0;
        Py_XDECREF(r);
    }
    Py_XDECREF(frame);
    if (rc < 0 && report(self->on_error) < 0)
        Py_CLEAR(out);
    return out;
}

static PyObject *hook_get(PyObject *self, PyObject *obj, PyObject *type) {
    if (obj == NULL || obj == Py_None) /* looked up on the class: the hook itself */
        return Py_NewRef(self);
    return PyMethod_New(self, obj);
}

static PyGetSetDef hook_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL}};

static PyTypeObject HookType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dpobs_otel.adapters.ray._fast.Hook",
    .tp_basicsize = sizeof(Hook),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Ray's serializer or deserializer, feeding the open op's frame.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)hook_init,
    .tp_dealloc = (destructor)hook_dealloc,
    .tp_traverse = (traverseproc)hook_traverse,
    .tp_clear = (inquiry)hook_clear,
    .tp_call = (ternaryfunc)hook_call,
    .tp_descr_get = hook_get,
    .tp_dictoffset = offsetof(Hook, dict),
    .tp_getset = hook_getset,
};

static PyObject *fast_now(PyObject *module, PyObject *unused) {
    return PyFloat_FromDouble(now());
}

static PyObject *fast_plant(PyObject *module, PyObject *name) {
    const char *text = PyUnicode_Check(name) ? PyUnicode_AsUTF8(name) : NULL;
    if (text == NULL || (strcmp(text, "object_size") && strcmp(text, "stored_size")
                         && strcmp(text, ""))) {
        PyErr_SetString(PyExc_ValueError, "plant(): 'object_size', 'stored_size' or ''");
        return NULL;
    }
    planted = !strcmp(text, "object_size") ? PLANT_OBJECT_SIZE
        : !strcmp(text, "stored_size") ? PLANT_STORED_SIZE : PLANT_NONE;
    Py_RETURN_NONE;
}

static PyMethodDef fast_methods[] = {
    {"now", fast_now, METH_NOARGS, "The clock the ops are timed on (time.perf_counter's)."},
    {"plant", fast_plant, METH_O, "plant(name): that size reader raises from now on ('': "
     "none does). For the tests that break each dpobs component on purpose."},
    {NULL}};

static struct PyModuleDef fast_module = {
    PyModuleDef_HEAD_INIT, "_fast", "The Ray adapter's op path in C.", -1, fast_methods};

PyMODINIT_FUNC PyInit__fast(void) {
    struct { PyObject **slot; const char *text; } strings[] = {
        {&s_current, "current"}, {&s_adapter, "adapter"}, {&s_frame, "frame"},
        {&s_pending, "pending"}, {&s_drain, "drain"}};
    for (size_t i = 0; i < sizeof strings / sizeof *strings; i++)
        if ((*strings[i].slot = PyUnicode_InternFromString(strings[i].text)) == NULL)
            return NULL;
    PyTypeObject *types[] = {&FrameType, &OpType, &HookType};
    for (size_t i = 0; i < 3; i++)
        if (PyType_Ready(types[i]) < 0)
            return NULL;
    PyObject *m = PyModule_Create(&fast_module);
    if (m == NULL)
        return NULL;
    const char *names[] = {"Frame", "Op", "Hook"};
    for (size_t i = 0; i < 3; i++) {
        Py_INCREF(types[i]);
        if (PyModule_AddObject(m, names[i], (PyObject *)types[i]) < 0) {
            Py_DECREF(types[i]);
            Py_DECREF(m);
            return NULL;
        }
    }
    return m;
}
