/* pymetaq.client._speedups: the client's optional C accelerator.
 *
 * The per-message hot paths of the producer and the consumer, each the exact equivalent of
 * pure-Python code that stays the reference and the fallback (pymetaq.client.speedups picks
 * one; the records' framing is pymetaq.storage._speedups'):
 *
 *   LaneSender(python_send, engine, cache, counter, lane_of, acc, max_bytes, cap, bcap,
 *              lane_append, block_s, handle_type, lane_type)
 *       A callable with send_async's signature. send_async(topic, value) with exactly two
 *       positional arguments, or with partition=<int> as the only keyword, runs
 *       lanes.lane_sender's fast path here; any other call (a key, a positional partition,
 *       an attribute, force, other keywords) goes to python_send, the Python closure,
 *       unchanged. The fast path only reads what the closure reads and calls what it calls
 *       (rr, acc.attend, lane_append), in the same order, holding the GIL throughout.
 *
 *   messages(cls, topic, partition, broker_id, bounds, ids, values, lo, hi) -> iterator
 *       The Message of each plain record lo..hi of a fetched batch, built directly (one
 *       allocation each). Python: consumer.batch.MessageBatch.__iter__'s map over zip.
 *
 *   record_messages(cls, topic, partition, broker_id, buf, positions, base, lo, hi) -> iterator
 *   record_values(buf, positions, lo, hi) -> list
 *       The same over a reply kept whole (consumer.batch.RecordBatch): record k of buf spans
 *       positions[k]..positions[k + 1] (native int64s, from storage's index_records), its id
 *       is the header's bytes 8..15 and its payload the bytes after the 20-byte header; its
 *       offset is base + positions[k]. The payload is copied out when the message is built,
 *       by the thread that asks for it. Python: RecordBatch's _make and its pure-Python
 *       iteration and values().
 *
 *   BodyBuffer(n)
 *       A long reply body received in place (recv_into a memoryview of it), then take()n as
 *       bytes without a copy. Python: protocol.parser's bytearray and bytes() of it.
 *
 *   lane_callback_method(handle_type) -> method descriptor
 *       LaneHandle.add_done_callback(fn) (lanes.py: the reference, kept as
 *       LaneHandle.py_add_done_callback): a value not absorbed yet keeps (index, fn, handle)
 *       on its lane under the accumulator's lock (Accumulator.lane_callback), an absorbed
 *       one gives fn to its batch (Batch.add_callback).
 *
 *   lane_exception_method(handle_type, fallback) -> method descriptor
 *       LaneHandle.exception(timeout=None) (lanes.py: the reference, kept as
 *       LaneHandle.py_exception): the error of the batch of an absorbed value whose
 *       callbacks have run (batch.callbacks is None: its outcome is final); anything else is
 *       fallback(handle, *args, **kwargs) (SendHandle.exception: waits, raises on timeout).
 *
 *   attach(callbacks, n, starts, slices) -> list
 *       Accumulator._attach's walk: each (index, fn, handle) of the flat callbacks with
 *       index < n goes to the callbacks of the batch of the slice that holds the index
 *       (slices[bisect_right(starts, index) - 1].batch.callbacks += (fn, handle)); the others
 *       are returned, flat, in order.
 *
 *   run_callbacks(callbacks, no_arg, report)
 *       Batch.complete's loop over the flat pairs fn, arg: fn() when arg is no_arg, else
 *       fn(arg); an Exception raised by one is handed to report(fn, exc) and the loop goes
 *       on; anything else (KeyboardInterrupt, SystemExit) propagates at once.
 *
 * Thread-safety: the GIL is held throughout; nothing here keeps state between calls except
 * the LaneSender's references (set once).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* ---------------------------------------------------------------- LaneSender */

static PyObject *str_divert, *str_owner, *str_values, *str_nbytes, *str_closed, *str_attend;
static PyObject *str_pinned, *str_partition;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *python_send; /* the Python closure: every call that is not (topic, value) */
    PyObject *engine;      /* engine._divert: closed, or transactions in use */
    PyObject *cache;       /* topic -> partitions (a dict) */
    PyObject *rr;          /* the round robin counter (an iterator: its next value) */
    PyObject *lane_of;     /* partition -> open lane (a dict) */
    PyObject *acc;         /* the accumulator: .owner, .attend(lane) */
    Py_ssize_t max_bytes, cap, bcap;
    PyObject *lane_append; /* acc.lane_append(tp, value, block_s, pinned) */
    PyObject *block_s;
    PyTypeObject *handle_type; /* LaneHandle: a tuple subclass */
    PyTypeObject *lane_type;   /* Lane, whose slots are read at their offsets */
    Py_ssize_t off_values, off_nbytes, off_closed, off_pinned; /* Lane's slots, 0: GetAttr */
    unsigned long owner;       /* acc.owner once set (it never changes after) */
    int owner_known;
} LaneSender;

/* a slot of obj: at its offset when obj is exactly the Lane type, else by name (new ref) */
static inline PyObject *
lane_get(LaneSender *self, PyObject *obj, Py_ssize_t off, PyObject *name)
{
    if (off && Py_TYPE(obj) == self->lane_type) {
        PyObject *v = *(PyObject **)((char *)obj + off);
        if (v != NULL)
            return Py_NewRef(v);
    }
    return PyObject_GetAttr(obj, name);
}

static inline int
lane_set(LaneSender *self, PyObject *obj, Py_ssize_t off, PyObject *name, PyObject *v)
{
    if (off && Py_TYPE(obj) == self->lane_type) {
        Py_XSETREF(*(PyObject **)((char *)obj + off), Py_NewRef(v));
        return 0;
    }
    return PyObject_SetAttr(obj, name, v);
}

/* the offset of a __slots__ member of type (an object slot), or 0 */
static Py_ssize_t
slot_offset(PyTypeObject *type, const char *name)
{
    PyObject *d = PyObject_GetAttrString((PyObject *)type, name);
    if (d == NULL) {
        PyErr_Clear();
        return 0;
    }
    Py_ssize_t off = 0;
    if (Py_IS_TYPE(d, &PyMemberDescr_Type)) {
        PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
        if (m->type == T_OBJECT_EX && !(m->flags & READONLY))
            off = m->offset;
    }
    Py_DECREF(d);
    return off;
}

static PyObject *
lane_handle(LaneSender *self, PyObject *lane, Py_ssize_t index)
{
    PyObject *i = PyLong_FromSsize_t(index);
    if (i == NULL)
        return NULL;
    PyObject *h = self->handle_type->tp_alloc(self->handle_type, 2);
    if (h == NULL) {
        Py_DECREF(i);
        return NULL;
    }
    Py_INCREF(lane);
    PyTuple_SET_ITEM(h, 0, lane);
    PyTuple_SET_ITEM(h, 1, i);
    return h;
}

/* 1: this thread is the lanes' owner; 0: not (or no owner yet); -1: error */
static int
is_owner(LaneSender *self)
{
    if (self->owner_known)
        return self->owner == PyThread_get_thread_ident();
    PyObject *owner = PyObject_GetAttr(self->acc, str_owner);
    if (owner == NULL)
        return -1;
    if (owner == Py_None) {
        Py_DECREF(owner);
        return 0;
    }
    unsigned long o = PyLong_AsUnsignedLongMask(owner);
    Py_DECREF(owner);
    if (o == (unsigned long)-1 && PyErr_Occurred())
        return -1;
    self->owner = o;
    self->owner_known = 1;
    return o == PyThread_get_thread_ident();
}

/* the fast path, from after the round robin step: append to tp's lane or lane_append */
static PyObject *
lane_send(LaneSender *self, PyObject *tp, PyObject *value, Py_ssize_t n, int pin)
{
    PyObject *lane = PyDict_GetItemWithError(self->lane_of, tp); /* borrowed */
    if (lane == NULL && PyErr_Occurred())
        return NULL;
    if (lane != NULL) {
        Py_INCREF(lane);
        int owner = is_owner(self);
        if (owner < 0)
            goto error;
        if (owner) {
            PyObject *values = lane_get(self, lane, self->off_values, str_values);
            if (values == NULL)
                goto error;
            if (!PyList_CheckExact(values)) {
                Py_DECREF(values);
                PyErr_SetString(PyExc_TypeError, "lane.values is not a list");
                goto error;
            }
            Py_ssize_t i = PyList_GET_SIZE(values);
            PyObject *nb = lane_get(self, lane, self->off_nbytes, str_nbytes);
            if (nb == NULL) {
                Py_DECREF(values);
                goto error;
            }
            Py_ssize_t nbytes = PyLong_AsSsize_t(nb);
            Py_DECREF(nb);
            if (nbytes == -1 && PyErr_Occurred()) {
                Py_DECREF(values);
                goto error;
            }
            if (i < self->cap && nbytes < self->bcap) {
                if (pin) { /* pinned before the value is appended (see Lane.pinned) */
                    PyObject *was = lane_get(self, lane, self->off_pinned, str_pinned);
                    if (was == NULL) {
                        Py_DECREF(values);
                        goto error;
                    }
                    int set = was == Py_True ? 1 : PyObject_IsTrue(was);
                    Py_DECREF(was);
                    if (set < 0 ||
                        (!set && lane_set(self, lane, self->off_pinned, str_pinned, Py_True) < 0)) {
                        Py_DECREF(values);
                        goto error;
                    }
                }
                int rc = PyList_Append(values, value);
                Py_DECREF(values);
                if (rc < 0)
                    goto error;
                PyObject *nb2 = PyLong_FromSsize_t(nbytes + n);
                if (nb2 == NULL)
                    goto error;
                rc = lane_set(self, lane, self->off_nbytes, str_nbytes, nb2);
                Py_DECREF(nb2);
                if (rc < 0)
                    goto error;
                PyObject *closed = lane_get(self, lane, self->off_closed, str_closed);
                if (closed == NULL)
                    goto error;
                int truth = closed == Py_False ? 0 : PyObject_IsTrue(closed);
                Py_DECREF(closed);
                if (truth < 0)
                    goto error;
                if (truth) { /* absorbed meanwhile: file this one too */
                    PyObject *r = PyObject_CallMethodOneArg(self->acc, str_attend, lane);
                    if (r == NULL)
                        goto error;
                    Py_DECREF(r);
                }
                PyObject *h = lane_handle(self, lane, i);
                Py_DECREF(lane);
                return h;
            }
            Py_DECREF(values);
        }
        Py_DECREF(lane);
    }
    PyObject *args[4] = {tp, value, self->block_s, pin ? Py_True : Py_False};
    return PyObject_Vectorcall(self->lane_append, args, 4, NULL);
error:
    Py_DECREF(lane);
    return NULL;
}

static PyObject *
lane_sender_call(PyObject *op, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    LaneSender *self = (LaneSender *)op;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    /* (topic, value), or (topic, value, partition=<int>): anything else is the closure's */
    PyObject *partition = NULL;
    if (kwnames != NULL) {
        if (PyTuple_GET_SIZE(kwnames) != 1 || nargs != 2 ||
            (PyTuple_GET_ITEM(kwnames, 0) != str_partition &&
             PyUnicode_Compare(PyTuple_GET_ITEM(kwnames, 0), str_partition) != 0) ||
            !PyLong_CheckExact(args[2]))
            return PyObject_Vectorcall(self->python_send, args, nargsf, kwnames);
        partition = args[2];
    }
    if (nargs != 2 || !PyBytes_CheckExact(args[1]))
        return PyObject_Vectorcall(self->python_send, args, nargsf, kwnames);
    PyObject *topic = args[0], *value = args[1];
    PyObject *divert = PyObject_GetAttr(self->engine, str_divert);
    if (divert == NULL)
        return NULL;
    int diverted = divert == Py_False ? 0 : PyObject_IsTrue(divert);
    Py_DECREF(divert);
    if (diverted < 0)
        return NULL;
    if (diverted)
        return PyObject_Vectorcall(self->python_send, args, nargsf, kwnames);
    PyObject *parts = PyDict_GetItemWithError(self->cache, topic); /* borrowed */
    if (parts == NULL && PyErr_Occurred())
        return NULL;
    Py_ssize_t n = PyBytes_GET_SIZE(value);
    if (parts == NULL || n > self->max_bytes || !PyList_CheckExact(parts) ||
        PyList_GET_SIZE(parts) == 0)
        return PyObject_Vectorcall(self->python_send, args, nargsf, kwnames);
    if (partition != NULL) { /* an explicit index in range: that partition's lane, pinned */
        int overflow = 0;
        long long want = PyLong_AsLongLongAndOverflow(partition, &overflow);
        if (want == -1 && PyErr_Occurred())
            return NULL;
        if (overflow || want < 0 || want >= (long long)PyList_GET_SIZE(parts))
            return PyObject_Vectorcall(self->python_send, args, nargsf, kwnames);
        PyObject *tp = Py_NewRef(PyList_GET_ITEM(parts, (Py_ssize_t)want));
        PyObject *out = lane_send(self, tp, value, n, 1);
        Py_DECREF(tp);
        return out;
    }
    Py_INCREF(parts); /* the cache may swap the list while rr runs */
    PyObject *count = Py_TYPE(self->rr)->tp_iternext(self->rr);
    if (count == NULL && !PyErr_Occurred())
        PyErr_SetNone(PyExc_StopIteration);
    if (count == NULL) {
        Py_DECREF(parts);
        return NULL;
    }
    Py_ssize_t nparts = PyList_GET_SIZE(parts), k = PyLong_AsSsize_t(count);
    if (k >= 0) {
        k %= nparts;
    } else { /* a counter past Py_ssize_t (or negative): Python's modulo */
        PyErr_Clear();
        PyObject *len = PyLong_FromSsize_t(nparts);
        PyObject *idx = len == NULL ? NULL : PyNumber_Remainder(count, len);
        Py_XDECREF(len);
        k = idx == NULL ? -1 : PyLong_AsSsize_t(idx);
        Py_XDECREF(idx);
        if (k == -1 && PyErr_Occurred()) {
            Py_DECREF(count);
            Py_DECREF(parts);
            return NULL;
        }
    }
    Py_DECREF(count);
    PyObject *tp = PyList_GET_ITEM(parts, k);
    Py_INCREF(tp);
    Py_DECREF(parts);
    PyObject *out = lane_send(self, tp, value, n, 0);
    Py_DECREF(tp);
    return out;
}

static int
lane_sender_init(LaneSender *self, PyObject *args, PyObject *kwds)
{
    PyObject *python_send, *engine, *cache, *rr, *lane_of, *acc, *lane_append, *block_s;
    PyObject *handle_type, *lane_type;
    Py_ssize_t max_bytes, cap, bcap;
    if (kwds != NULL && PyDict_GET_SIZE(kwds)) {
        PyErr_SetString(PyExc_TypeError, "LaneSender() takes positional arguments only");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "OOO!OO!Onnn" "OOO!O!:LaneSender", &python_send, &engine,
                          &PyDict_Type, &cache, &rr, &PyDict_Type, &lane_of, &acc, &max_bytes,
                          &cap, &bcap, &lane_append, &block_s, &PyType_Type, &handle_type,
                          &PyType_Type, &lane_type))
        return -1;
    if (!PyType_IsSubtype((PyTypeObject *)handle_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "LaneSender(): the handle type must subclass tuple");
        return -1;
    }
#define SET(field, v) do { Py_INCREF(v); Py_XSETREF(self->field, v); } while (0)
    if (!PyIter_Check(rr)) {
        PyErr_SetString(PyExc_TypeError, "LaneSender(): rr must be an iterator");
        return -1;
    }
    SET(python_send, python_send);
    SET(engine, engine);
    SET(cache, cache);
    SET(rr, rr);
    SET(lane_of, lane_of);
    SET(acc, acc);
    SET(lane_append, lane_append);
    SET(block_s, block_s);
    Py_INCREF(handle_type);
    Py_XSETREF(self->handle_type, (PyTypeObject *)handle_type);
    Py_INCREF(lane_type);
    Py_XSETREF(self->lane_type, (PyTypeObject *)lane_type);
#undef SET
    self->off_values = slot_offset((PyTypeObject *)lane_type, "values");
    self->off_nbytes = slot_offset((PyTypeObject *)lane_type, "nbytes");
    self->off_closed = slot_offset((PyTypeObject *)lane_type, "closed");
    self->off_pinned = slot_offset((PyTypeObject *)lane_type, "pinned");
    self->owner_known = 0;
    self->max_bytes = max_bytes;
    self->cap = cap;
    self->bcap = bcap;
    self->vectorcall = lane_sender_call;
    return 0;
}

static int
lane_sender_traverse(LaneSender *self, visitproc visit, void *arg)
{
    Py_VISIT(self->python_send);
    Py_VISIT(self->engine);
    Py_VISIT(self->cache);
    Py_VISIT(self->rr);
    Py_VISIT(self->lane_of);
    Py_VISIT(self->acc);
    Py_VISIT(self->lane_append);
    Py_VISIT(self->block_s);
    Py_VISIT(self->handle_type);
    Py_VISIT(self->lane_type);
    return 0;
}

static int
lane_sender_clear(LaneSender *self)
{
    Py_CLEAR(self->python_send);
    Py_CLEAR(self->engine);
    Py_CLEAR(self->cache);
    Py_CLEAR(self->rr);
    Py_CLEAR(self->lane_of);
    Py_CLEAR(self->acc);
    Py_CLEAR(self->lane_append);
    Py_CLEAR(self->block_s);
    Py_CLEAR(self->handle_type);
    Py_CLEAR(self->lane_type);
    return 0;
}

static void
lane_sender_dealloc(LaneSender *self)
{
    PyObject_GC_UnTrack(self);
    lane_sender_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
lane_sender_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    LaneSender *self = (LaneSender *)type->tp_alloc(type, 0);
    if (self != NULL)
        self->vectorcall = lane_sender_call; /* callable before __init__ too: it forwards */
    return (PyObject *)self;
}

static PyObject *
lane_sender_tp_call(PyObject *op, PyObject *args, PyObject *kwargs)
{
    return PyVectorcall_Call(op, args, kwargs);
}

static PyObject *
lane_sender_get_python(LaneSender *self, void *closure)
{
    if (self->python_send == NULL)
        Py_RETURN_NONE;
    return Py_NewRef(self->python_send);
}

static PyGetSetDef lane_sender_getset[] = {
    {"python_send", (getter)lane_sender_get_python, NULL,
     "the Python send_async every call that is not (topic, value) goes to", NULL},
    {NULL},
};

static PyTypeObject LaneSenderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pymetaq.client._speedups.LaneSender",
    .tp_doc = "send_async's lane fast path (see lanes.lane_sender)",
    .tp_basicsize = sizeof(LaneSender),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(LaneSender, vectorcall),
    .tp_call = lane_sender_tp_call,
    .tp_new = lane_sender_new,
    .tp_init = (initproc)lane_sender_init,
    .tp_traverse = (traverseproc)lane_sender_traverse,
    .tp_clear = (inquiry)lane_sender_clear,
    .tp_dealloc = (destructor)lane_sender_dealloc,
    .tp_getset = lane_sender_getset,
};

/* ---------------------------------------------------------------- messages */

/* seq[i] as a new reference (lists and tuples read directly, anything else by index) */
static inline PyObject *
item(PyObject *seq, Py_ssize_t i)
{
    if (PyList_CheckExact(seq)) {
        if (i < PyList_GET_SIZE(seq))
            return Py_NewRef(PyList_GET_ITEM(seq, i));
    } else if (PyTuple_CheckExact(seq)) {
        if (i < PyTuple_GET_SIZE(seq))
            return Py_NewRef(PyTuple_GET_ITEM(seq, i));
    } else {
        return PySequence_GetItem(seq, i);
    }
    PyErr_SetString(PyExc_IndexError, "messages(): a column is shorter than the batch");
    return NULL;
}

/* A reply kept whole: record k spans buf[pos[k]:pos[k + 1]], at offset base + pos[k]. */
typedef struct {
    const char *buf;
    Py_ssize_t len;
    const char *pos; /* native int64s */
    long long base;
} Records;

/* check buf, positions, base (NULL: 0) and lo..hi (hi + 1 positions must exist) */
static int
records_init(Records *r, PyObject *buf, PyObject *positions, PyObject *base, Py_ssize_t lo,
             Py_ssize_t hi, const char *who)
{
    if (!PyBytes_CheckExact(buf) || !PyBytes_CheckExact(positions)) {
        PyErr_Format(PyExc_TypeError, "%s(): buf and positions must be bytes", who);
        return -1;
    }
    r->buf = PyBytes_AS_STRING(buf);
    r->len = PyBytes_GET_SIZE(buf);
    r->pos = PyBytes_AS_STRING(positions);
    r->base = 0;
    if (base != NULL) {
        r->base = PyLong_AsLongLong(base);
        if (r->base == -1 && PyErr_Occurred())
            return -1;
        if (r->base < 0 || r->base > LLONG_MAX - r->len) {
            PyErr_Format(PyExc_ValueError, "%s(): base out of range", who);
            return -1;
        }
    }
    if (lo < 0 || hi < lo || PyBytes_GET_SIZE(positions) / 8 <= hi) {
        PyErr_Format(PyExc_ValueError, "%s(): need 0 <= lo <= hi < len(positions)", who);
        return -1;
    }
    return 0;
}

/* record k's start p and end q: 0, or -1 with ValueError when they are not a record of buf */
static inline int
record_span(const Records *r, Py_ssize_t k, long long *p, long long *q)
{
    int64_t a, b;
    memcpy(&a, r->pos + 8 * k, 8);
    memcpy(&b, r->pos + 8 * (k + 1), 8);
    if (a < 0 || b > r->len || b - a < 20) {
        PyErr_Format(PyExc_ValueError, "positions %zd..%zd are not a record of buf", k, k + 1);
        return -1;
    }
    *p = a;
    *q = b;
    return 0;
}

/* the payload: the bytes after the 20-byte header */
static inline PyObject *
record_value(const Records *r, long long p, long long q)
{
    return PyBytes_FromStringAndSize(r->buf + p + 20, (Py_ssize_t)(q - p - 20));
}

/* the id: the header's bytes 8..15, big-endian, signed */
static inline PyObject *
record_id(const Records *r, long long p)
{
    const unsigned char *h = (const unsigned char *)r->buf + p + 8;
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = (v << 8) | h[i];
    return PyLong_FromLongLong((long long)v);
}

/* The messages of records lo..hi, from one of two sources: columns (messages()) or a reply
 * kept whole (record_messages(): buf is set). */
typedef struct {
    PyObject_HEAD
    PyTypeObject *cls; /* Message: a tuple subclass of 9 fields */
    PyObject *topic, *partition, *broker;
    PyObject *bounds, *ids, *values; /* columns: record starts (+ the end), ids, payloads */
    PyObject *buf, *positions;       /* or a reply: kept alive for rec's pointers */
    Records rec;
    Py_ssize_t k, hi;
    int bounds_range;          /* bounds is a range: offset k is start + k * step */
    long long start, step;
    PyObject *ahead;           /* offset k when the last message built it as its next offset */
    int plain;                 /* cls is a plain tuple subclass: new_message() may build it */
} MessageIter;

/* cls adds nothing to tuple's layout (no __dict__, no __weakref__, no slots): Message, a
 * NamedTuple */
static int
plain_tuple_subclass(PyTypeObject *cls)
{
    return cls->tp_basicsize == PyTuple_Type.tp_basicsize &&
           cls->tp_itemsize == PyTuple_Type.tp_itemsize && cls->tp_dictoffset == 0 &&
           cls->tp_weaklistoffset == 0;
}

/* A 9-item instance of a plain tuple subclass, its items to be set by the caller, and left
 * untracked by the cycle collector: a Message holds only str, int, bytes and None, so it can
 * be in no cycle (CPython untracks such tuples itself, on their first collection). Against
 * tp_alloc: no zeroing, no tracking, no untracking when it is freed (in messages/s, about
 * 10% of building and dropping one). */
static PyObject *
new_message(PyTypeObject *cls)
{
    return (PyObject *)PyObject_GC_NewVar(PyTupleObject, cls, 9);
}

/* bounds[k] as a new reference */
static inline PyObject *
bound(MessageIter *it, Py_ssize_t k)
{
    if (it->bounds_range)
        return PyLong_FromLongLong(it->start + (long long)k * it->step);
    return item(it->bounds, k);
}

/* record k's offset (unless it is ahead), next offset, id and payload, as new references */
static int
message_fields(MessageIter *it, Py_ssize_t k, PyObject **offset, PyObject **nxt, PyObject **id,
               PyObject **value)
{
    if (it->buf != NULL) {
        long long p, q;
        if (record_span(&it->rec, k, &p, &q) < 0 ||
            (*offset == NULL && (*offset = PyLong_FromLongLong(it->rec.base + p)) == NULL))
            return -1;
        return (*nxt = PyLong_FromLongLong(it->rec.base + q)) == NULL ||
                       (*id = record_id(&it->rec, p)) == NULL ||
                       (*value = record_value(&it->rec, p, q)) == NULL
                   ? -1
                   : 0;
    }
    return (*offset == NULL && (*offset = bound(it, k)) == NULL) ||
                   (*nxt = bound(it, k + 1)) == NULL || (*id = item(it->ids, k)) == NULL ||
                   (*value = item(it->values, k)) == NULL
               ? -1
               : 0;
}

static PyObject *
message_iter_next(MessageIter *it)
{
    Py_ssize_t k = it->k;
    if (k >= it->hi)
        return NULL;
    /* a message's offset is the previous one's next offset: built once, shared */
    PyObject *offset = it->ahead, *nxt = NULL, *id = NULL, *value = NULL;
    it->ahead = NULL;
    if (message_fields(it, k, &offset, &nxt, &id, &value) < 0)
        goto error;
    PyObject *m = it->plain ? new_message(it->cls) : it->cls->tp_alloc(it->cls, 9);
    if (m == NULL)
        goto error;
    PyTuple_SET_ITEM(m, 0, Py_NewRef(it->topic));
    PyTuple_SET_ITEM(m, 1, Py_NewRef(it->partition));
    PyTuple_SET_ITEM(m, 2, offset);
    PyTuple_SET_ITEM(m, 3, id);
    PyTuple_SET_ITEM(m, 4, value);
    PyTuple_SET_ITEM(m, 5, Py_NewRef(Py_None));
    PyTuple_SET_ITEM(m, 6, nxt);
    PyTuple_SET_ITEM(m, 7, Py_NewRef(it->broker));
    PyTuple_SET_ITEM(m, 8, Py_NewRef(Py_None));
    it->k = k + 1;
    if (k + 1 < it->hi)
        it->ahead = Py_NewRef(nxt);
    return m;
error:
    Py_XDECREF(offset);
    Py_XDECREF(nxt);
    Py_XDECREF(id);
    Py_XDECREF(value);
    return NULL;
}

static int
message_iter_traverse(MessageIter *it, visitproc visit, void *arg)
{
    Py_VISIT(it->cls);
    Py_VISIT(it->topic);
    Py_VISIT(it->partition);
    Py_VISIT(it->broker);
    Py_VISIT(it->bounds);
    Py_VISIT(it->ids);
    Py_VISIT(it->values);
    Py_VISIT(it->buf);
    Py_VISIT(it->positions);
    Py_VISIT(it->ahead);
    return 0;
}

static int
message_iter_clear(MessageIter *it)
{
    it->hi = 0; /* an iterator cleared by the GC must not read its sources again */
    Py_CLEAR(it->cls);
    Py_CLEAR(it->topic);
    Py_CLEAR(it->partition);
    Py_CLEAR(it->broker);
    Py_CLEAR(it->bounds);
    Py_CLEAR(it->ids);
    Py_CLEAR(it->values);
    Py_CLEAR(it->buf);
    Py_CLEAR(it->positions);
    Py_CLEAR(it->ahead);
    return 0;
}

static void
message_iter_dealloc(MessageIter *it)
{
    PyObject_GC_UnTrack(it);
    message_iter_clear(it);
    PyObject_GC_Del(it);
}

static PyObject *
message_iter_length_hint(MessageIter *it, PyObject *unused)
{
    return PyLong_FromSsize_t(it->hi > it->k ? it->hi - it->k : 0);
}

static PyMethodDef message_iter_methods[] = {
    {"__length_hint__", (PyCFunction)message_iter_length_hint, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject MessageIterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pymetaq.client._speedups.MessageIter",
    .tp_doc = "the messages of a batch's records lo..hi (see messages(), record_messages())",
    .tp_basicsize = sizeof(MessageIter),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)message_iter_next,
    .tp_traverse = (traverseproc)message_iter_traverse,
    .tp_clear = (inquiry)message_iter_clear,
    .tp_dealloc = (destructor)message_iter_dealloc,
    .tp_methods = message_iter_methods,
};

static int
lo_hi(PyObject *lo_obj, PyObject *hi_obj, Py_ssize_t *lo, Py_ssize_t *hi)
{
    *lo = PyLong_AsSsize_t(lo_obj);
    if (*lo == -1 && PyErr_Occurred())
        return -1;
    *hi = PyLong_AsSsize_t(hi_obj);
    if (*hi == -1 && PyErr_Occurred())
        return -1;
    return 0;
}

/* a new iterator over records lo..hi with the Message fields of args[0..3], no source yet */
static MessageIter *
message_iter_new(PyObject *const *args, Py_ssize_t lo, Py_ssize_t hi, const char *who)
{
    if (!PyType_Check(args[0]) || !PyType_IsSubtype((PyTypeObject *)args[0], &PyTuple_Type)) {
        PyErr_Format(PyExc_TypeError, "%s(): cls must subclass tuple", who);
        return NULL;
    }
    MessageIter *it = PyObject_GC_New(MessageIter, &MessageIterType);
    if (it == NULL)
        return NULL;
    it->cls = (PyTypeObject *)Py_NewRef(args[0]);
    it->topic = Py_NewRef(args[1]);
    it->partition = Py_NewRef(args[2]);
    it->broker = Py_NewRef(args[3]);
    it->bounds = it->ids = it->values = it->buf = it->positions = it->ahead = NULL;
    it->k = lo;
    it->hi = hi;
    it->bounds_range = 0;
    it->plain = plain_tuple_subclass(it->cls);
    return it;
}

/* messages(cls, topic, partition, broker_id, bounds, ids, values, lo, hi) -> iterator of
 * cls(topic, partition, bounds[k], ids[k], values[k], None, bounds[k + 1], broker_id, None)
 * for k in lo..hi: MessageBatch.__iter__'s map(tuple.__new__, repeat(cls), zip(...)) */
static PyObject *
speedups_messages(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError,
                        "messages(cls, topic, partition, broker_id, bounds, ids, values, lo, hi)");
        return NULL;
    }
    Py_ssize_t lo, hi;
    if (lo_hi(args[7], args[8], &lo, &hi) < 0)
        return NULL;
    if (lo < 0 || hi < lo) {
        PyErr_SetString(PyExc_ValueError, "messages(): 0 <= lo <= hi");
        return NULL;
    }
    MessageIter *it = message_iter_new(args, lo, hi, "messages");
    if (it == NULL)
        return NULL;
    it->bounds = Py_NewRef(args[4]);
    it->ids = Py_NewRef(args[5]);
    it->values = Py_NewRef(args[6]);
    if (Py_IS_TYPE(args[4], &PyRange_Type)) { /* a run's bounds: computed, not indexed */
        PyObject *start = PyObject_GetAttrString(args[4], "start");
        PyObject *step = start == NULL ? NULL : PyObject_GetAttrString(args[4], "step");
        PyObject *len = step == NULL ? NULL : PyLong_FromSsize_t(PyObject_Length(args[4]));
        if (len != NULL) {
            int overflow = 0;
            long long a = PyLong_AsLongLongAndOverflow(start, &overflow);
            long long b = overflow ? 0 : PyLong_AsLongLongAndOverflow(step, &overflow);
            Py_ssize_t n = PyLong_AsSsize_t(len);
            /* every offset up to the range's end fits in a long long: compute them */
            if (!overflow && !PyErr_Occurred() && b > 0 && a >= 0 &&
                a <= LLONG_MAX / 2 && hi < n && b <= (LLONG_MAX / 2) / (n + 1)) {
                it->bounds_range = 1;
                it->start = a;
                it->step = b;
            }
        }
        Py_XDECREF(start);
        Py_XDECREF(step);
        Py_XDECREF(len);
        if (PyErr_Occurred()) {
            Py_DECREF(it);
            return NULL;
        }
    }
    PyObject_GC_Track(it);
    return (PyObject *)it;
}

/* record_messages(cls, topic, partition, broker_id, buf, positions, base, lo, hi) */
static PyObject *
speedups_record_messages(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "record_messages(cls, topic, partition, broker_id, "
                                         "buf, positions, base, lo, hi)");
        return NULL;
    }
    Py_ssize_t lo, hi;
    Records rec;
    if (lo_hi(args[7], args[8], &lo, &hi) < 0 ||
        records_init(&rec, args[4], args[5], args[6], lo, hi, "record_messages") < 0)
        return NULL;
    MessageIter *it = message_iter_new(args, lo, hi, "record_messages");
    if (it == NULL)
        return NULL;
    it->buf = Py_NewRef(args[4]);
    it->positions = Py_NewRef(args[5]);
    it->rec = rec;
    PyObject_GC_Track(it);
    return (PyObject *)it;
}

/* record_values(buf, positions, lo, hi) -> [payload of record k for k in lo..hi] */
static PyObject *
speedups_record_values(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "record_values(buf, positions, lo, hi)");
        return NULL;
    }
    Py_ssize_t lo, hi;
    Records rec;
    if (lo_hi(args[2], args[3], &lo, &hi) < 0 ||
        records_init(&rec, args[0], args[1], NULL, lo, hi, "record_values") < 0)
        return NULL;
    PyObject *out = PyList_New(hi - lo);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t k = lo; k < hi; k++) {
        long long p, q;
        PyObject *v;
        if (record_span(&rec, k, &p, &q) < 0 || (v = record_value(&rec, p, q)) == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, k - lo, v);
    }
    return out;
}

/* ---------------------------------------------------------------- BodyBuffer */

/* A reply body received in place: a bytes object of n bytes, written through the buffer
 * protocol (socket.recv_into into a memoryview of it) and then handed out by take(). Python:
 * a bytearray and bytes(it) at the end, one more copy of the whole body. The bytes object is
 * seen by nobody else until take(), and take() refuses while a view of it is open, so no
 * bytes object is ever changed after someone could see it (socket.recv fills its result the
 * same way). */
typedef struct {
    PyObject_HEAD
    PyObject *bytes; /* NULL once taken */
    Py_ssize_t exports;
} BodyBuffer;

static PyObject *
body_buffer_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    Py_ssize_t n;
    static char *kwlist[] = {"n", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "n:BodyBuffer", kwlist, &n))
        return NULL;
    if (n < 2) { /* bytes of 0 or 1 byte may be shared singletons */
        PyErr_SetString(PyExc_ValueError, "BodyBuffer(): n must be at least 2");
        return NULL;
    }
    BodyBuffer *self = (BodyBuffer *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->exports = 0;
    self->bytes = PyBytes_FromStringAndSize(NULL, n);
    if (self->bytes == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static int
body_buffer_getbuffer(BodyBuffer *self, Py_buffer *view, int flags)
{
    if (self->bytes == NULL) {
        PyErr_SetString(PyExc_BufferError, "BodyBuffer: the body was taken");
        view->obj = NULL;
        return -1;
    }
    if (PyBuffer_FillInfo(view, (PyObject *)self, PyBytes_AS_STRING(self->bytes),
                          PyBytes_GET_SIZE(self->bytes), 0, flags) < 0)
        return -1;
    self->exports++;
    return 0;
}

static void
body_buffer_releasebuffer(BodyBuffer *self, Py_buffer *view)
{
    self->exports--;
}

static PyObject *
body_buffer_take(BodyBuffer *self, PyObject *unused)
{
    if (self->bytes == NULL) {
        PyErr_SetString(PyExc_BufferError, "BodyBuffer.take(): already taken");
        return NULL;
    }
    if (self->exports > 0) {
        PyErr_SetString(PyExc_BufferError, "BodyBuffer.take(): a view of it is still open");
        return NULL;
    }
    PyObject *b = self->bytes;
    self->bytes = NULL;
    return b;
}

static void
body_buffer_dealloc(BodyBuffer *self)
{
    Py_XDECREF(self->bytes);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyBufferProcs body_buffer_as_buffer = {
    .bf_getbuffer = (getbufferproc)body_buffer_getbuffer,
    .bf_releasebuffer = (releasebufferproc)body_buffer_releasebuffer,
};

static PyMethodDef body_buffer_methods[] = {
    {"take", (PyCFunction)body_buffer_take, METH_NOARGS,
     "take() -> bytes: the body (once, and only when no view of it is open)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject BodyBufferType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pymetaq.client._speedups.BodyBuffer",
    .tp_doc = "BodyBuffer(n): n bytes to receive a body into (writable buffer), then take()",
    .tp_basicsize = sizeof(BodyBuffer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = body_buffer_new,
    .tp_dealloc = (destructor)body_buffer_dealloc,
    .tp_as_buffer = &body_buffer_as_buffer,
    .tp_methods = body_buffer_methods,
};

/* ---------------------------------------------------------------- completion callbacks */

static PyObject *str_absorbed, *str_acc, *str_lock, *str_callbacks, *str_locate;
static PyObject *str_add_callback, *str_acquire, *str_release, *str_batch;
static PyObject *str_starts, *str_slices, *str_error;

/* obj.name as a Py_ssize_t: 0, or -1 with an exception set */
static int
ssize_attr(PyObject *obj, PyObject *name, Py_ssize_t *out)
{
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL)
        return -1;
    *out = PyLong_AsSsize_t(v);
    Py_DECREF(v);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

/* bisect_right(starts, index) - 1 over a list of ints: the slice holding index, or -1 */
static Py_ssize_t
slice_of(PyObject *starts, Py_ssize_t index)
{
    Py_ssize_t lo = 0, hi = PyList_GET_SIZE(starts);
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        Py_ssize_t v = PyLong_AsSsize_t(PyList_GET_ITEM(starts, mid));
        if (v == -1 && PyErr_Occurred())
            return -2;
        if (index < v)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo - 1;
}

/* slices[k].batch.callbacks (new reference), a list */
static PyObject *
batch_callbacks(PyObject *slices, Py_ssize_t k)
{
    PyObject *batch = PyObject_GetAttr(PyList_GET_ITEM(slices, k), str_batch);
    if (batch == NULL)
        return NULL;
    PyObject *cbs = PyObject_GetAttr(batch, str_callbacks);
    Py_DECREF(batch);
    if (cbs != NULL && !PyList_Check(cbs)) {
        PyErr_SetString(PyExc_RuntimeError, "attach(): a batch of the lane has completed");
        Py_CLEAR(cbs);
    }
    return cbs;
}

/* one (idx, fn, handle) of attach(): kept (index >= n) or filed in its slice's batch, whose
 * callbacks list is cached in *target for slice *last; 0, or -1 with an exception set */
static int
attach_one(PyObject *keep, PyObject **target, Py_ssize_t *last, PyObject *starts,
           PyObject *slices, Py_ssize_t n, PyObject *idx, PyObject *fn, PyObject *handle)
{
    Py_ssize_t index = PyLong_AsSsize_t(idx);
    if (index == -1 && PyErr_Occurred())
        return -1;
    if (index >= n)
        return PyList_Append(keep, idx) < 0 || PyList_Append(keep, fn) < 0 ||
                       PyList_Append(keep, handle) < 0
                   ? -1
                   : 0;
    Py_ssize_t k = slice_of(starts, index);
    if (k == -2)
        return -1;
    if (k < 0) {
        PyErr_Format(PyExc_ValueError, "attach(): no slice holds index %zd", index);
        return -1;
    }
    if (k != *last) {
        Py_XDECREF(*target);
        *target = batch_callbacks(slices, k);
        if (*target == NULL)
            return -1;
        *last = k;
    }
    return PyList_Append(*target, fn) < 0 || PyList_Append(*target, handle) < 0 ? -1 : 0;
}

static PyObject *
speedups_attach(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyList_Check(args[0]) || !PyLong_Check(args[1]) ||
        !PyList_Check(args[2]) || !PyList_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "attach(callbacks: list, n: int, starts: list, "
                                         "slices: list)");
        return NULL;
    }
    PyObject *cbs = args[0], *starts = args[2], *slices = args[3];
    Py_ssize_t n = PyLong_AsSsize_t(args[1]);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (PyList_GET_SIZE(cbs) % 3 || PyList_GET_SIZE(starts) != PyList_GET_SIZE(slices)) {
        PyErr_SetString(PyExc_ValueError, "attach(): callbacks are not triples, or starts "
                                          "and slices differ in length");
        return NULL;
    }
    PyObject *keep = PyList_New(0);
    if (keep == NULL)
        return NULL;
    Py_ssize_t last = -1;
    PyObject *target = NULL; /* the callbacks of slice `last` */
    /* the list is read by index, its size each time, each triple held while it is filed:
     * nothing here runs Python code that could change it, but a list is not ours to trust */
    for (Py_ssize_t i = 0; i + 2 < PyList_GET_SIZE(cbs); i += 3) {
        PyObject *idx = Py_NewRef(PyList_GET_ITEM(cbs, i));
        PyObject *fn = Py_NewRef(PyList_GET_ITEM(cbs, i + 1));
        PyObject *handle = Py_NewRef(PyList_GET_ITEM(cbs, i + 2));
        int ok = attach_one(keep, &target, &last, starts, slices, n, idx, fn, handle);
        Py_DECREF(idx);
        Py_DECREF(fn);
        Py_DECREF(handle);
        if (ok < 0) {
            Py_XDECREF(target);
            Py_DECREF(keep);
            return NULL;
        }
    }
    Py_XDECREF(target);
    return keep;
}

static PyObject *
speedups_run_callbacks(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "run_callbacks(callbacks: list, no_arg, report)");
        return NULL;
    }
    PyObject *cbs = Py_NewRef(args[0]), *no_arg = args[1], *report = args[2];
    /* pairs read by index, the size each time, as the Python loop's iterator reads the list
     * (it is the batch's, already detached: nobody appends to it); each pair held while it runs */
    for (Py_ssize_t i = 0; i + 1 < PyList_GET_SIZE(cbs); i += 2) {
        PyObject *fn = Py_NewRef(PyList_GET_ITEM(cbs, i));
        PyObject *arg = Py_NewRef(PyList_GET_ITEM(cbs, i + 1));
        PyObject *r = arg == no_arg ? PyObject_CallNoArgs(fn) : PyObject_CallOneArg(fn, arg);
        Py_DECREF(arg);
        if (r != NULL) {
            Py_DECREF(r);
            Py_DECREF(fn);
            continue;
        }
        if (!PyErr_ExceptionMatches(PyExc_Exception)) {
            Py_DECREF(fn);
            Py_DECREF(cbs);
            return NULL;
        }
        PyObject *et, *exc, *tb;
        PyErr_Fetch(&et, &exc, &tb);
        PyErr_NormalizeException(&et, &exc, &tb);
        if (tb != NULL && exc != NULL)
            PyException_SetTraceback(exc, tb);
        Py_XDECREF(et);
        Py_XDECREF(tb);
        if (exc == NULL) /* cannot happen after a failed call; keep the loop honest */
            exc = Py_NewRef(Py_None);
        PyObject *rr = PyObject_CallFunctionObjArgs(report, fn, exc, NULL);
        Py_DECREF(exc);
        Py_DECREF(fn);
        if (rr == NULL) {
            Py_DECREF(cbs);
            return NULL;
        }
        Py_DECREF(rr);
    }
    Py_DECREF(cbs);
    Py_RETURN_NONE;
}

/* LaneHandle.add_done_callback(fn): see the module doc */
static PyObject *
lane_handle_add_done_callback(PyObject *self, PyObject *fn)
{
    if (!PyTuple_Check(self) || PyTuple_GET_SIZE(self) != 2) {
        PyErr_SetString(PyExc_TypeError, "add_done_callback(): not a lane handle");
        return NULL;
    }
    PyObject *lane = PyTuple_GET_ITEM(self, 0), *idx = PyTuple_GET_ITEM(self, 1);
    Py_ssize_t index = PyLong_AsSsize_t(idx), a;
    if ((index == -1 && PyErr_Occurred()) || ssize_attr(lane, str_absorbed, &a) < 0)
        return NULL;
    if (index >= a) { /* Accumulator.lane_callback: checked again under its lock */
        PyObject *acc = PyObject_GetAttr(lane, str_acc);
        if (acc == NULL)
            return NULL;
        PyObject *lock = PyObject_GetAttr(acc, str_lock);
        Py_DECREF(acc);
        if (lock == NULL)
            return NULL;
        PyObject *r = PyObject_CallMethodNoArgs(lock, str_acquire);
        if (r == NULL) {
            Py_DECREF(lock);
            return NULL;
        }
        Py_DECREF(r);
        int kept = 0; /* 1 kept on the lane, 0 absorbed meanwhile, -1 error */
        if (ssize_attr(lane, str_absorbed, &a) < 0)
            kept = -1;
        else if (index >= a) {
            PyObject *cbs = PyObject_GetAttr(lane, str_callbacks);
            if (cbs == NULL)
                kept = -1;
            else if (!PyList_Check(cbs)) {
                PyErr_SetString(PyExc_TypeError, "lane.callbacks is not a list");
                kept = -1;
            } else
                kept = PyList_Append(cbs, idx) < 0 || PyList_Append(cbs, fn) < 0 ||
                               PyList_Append(cbs, self) < 0
                           ? -1
                           : 1;
            Py_XDECREF(cbs);
        }
        /* release even when an error is set: keep it across the call */
        PyObject *et = NULL, *ev = NULL, *etb = NULL;
        if (kept < 0)
            PyErr_Fetch(&et, &ev, &etb);
        r = PyObject_CallMethodNoArgs(lock, str_release);
        Py_DECREF(lock);
        if (r == NULL) {
            Py_XDECREF(et);
            Py_XDECREF(ev);
            Py_XDECREF(etb);
            return NULL;
        }
        Py_DECREF(r);
        if (kept < 0) {
            PyErr_Restore(et, ev, etb);
            return NULL;
        }
        if (kept)
            Py_RETURN_NONE;
    }
    PyObject *where = PyObject_CallMethodOneArg(lane, str_locate, idx);
    if (where == NULL)
        return NULL;
    if (!PyTuple_Check(where) || PyTuple_GET_SIZE(where) < 1) {
        Py_DECREF(where);
        PyErr_SetString(PyExc_TypeError, "lane.locate() did not return a tuple");
        return NULL;
    }
    PyObject *r = PyObject_CallMethodObjArgs(PyTuple_GET_ITEM(where, 0), str_add_callback, fn,
                                             self, NULL);
    Py_DECREF(where);
    if (r == NULL)
        return NULL;
    Py_DECREF(r);
    Py_RETURN_NONE;
}

/* SendHandle.exception, for what is not settled here (set by lane_exception_method) */
static PyObject *exception_fallback;

/* LaneHandle.exception(timeout=None): see the module doc */
static PyObject *
lane_handle_exception(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (PyTuple_Check(self) && PyTuple_GET_SIZE(self) == 2) {
        PyObject *lane = PyTuple_GET_ITEM(self, 0);
        Py_ssize_t index = PyLong_AsSsize_t(PyTuple_GET_ITEM(self, 1)), a;
        if ((index == -1 && PyErr_Occurred()) || ssize_attr(lane, str_absorbed, &a) < 0)
            return NULL;
        if (index < a) {
            PyObject *starts = PyObject_GetAttr(lane, str_starts);
            PyObject *slices = starts != NULL ? PyObject_GetAttr(lane, str_slices) : NULL;
            PyObject *batch = NULL;
            if (slices != NULL && PyList_Check(starts) && PyList_Check(slices) &&
                PyList_GET_SIZE(starts) == PyList_GET_SIZE(slices)) {
                Py_ssize_t k = slice_of(starts, index);
                if (k >= 0)
                    batch = PyObject_GetAttr(PyList_GET_ITEM(slices, k), str_batch);
            }
            Py_XDECREF(starts);
            Py_XDECREF(slices);
            if (PyErr_Occurred()) {
                Py_XDECREF(batch);
                return NULL;
            }
            if (batch != NULL) {
                PyObject *cbs = PyObject_GetAttr(batch, str_callbacks);
                if (cbs == NULL) {
                    Py_DECREF(batch);
                    return NULL;
                }
                int settled = cbs == Py_None;
                Py_DECREF(cbs);
                if (settled) { /* completed: its error is final */
                    PyObject *err = PyObject_GetAttr(batch, str_error);
                    Py_DECREF(batch);
                    return err;
                }
                Py_DECREF(batch);
            }
        }
    }
    if (exception_fallback == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "exception(): no fallback set");
        return NULL;
    }
    /* fallback(self, *args, **kwargs) */
    PyObject *small[8];
    PyObject **all = small;
    Py_ssize_t nkw = kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0;
    if (nargs + nkw + 1 > 8) {
        all = PyMem_Malloc((nargs + nkw + 1) * sizeof(PyObject *));
        if (all == NULL)
            return PyErr_NoMemory();
    }
    all[0] = self;
    for (Py_ssize_t i = 0; i < nargs + nkw; i++)
        all[i + 1] = args[i];
    PyObject *r = PyObject_Vectorcall(exception_fallback, all, nargs + 1, kwnames);
    if (all != small)
        PyMem_Free(all);
    return r;
}

static PyMethodDef lane_handle_exception_def = {
    "exception", (PyCFunction)(void (*)(void))lane_handle_exception,
    METH_FASTCALL | METH_KEYWORDS,
    "the error of the message's completed batch (None: stored), else SendHandle.exception"};

static PyObject *
speedups_lane_exception_method(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyType_Check(args[0]) ||
        !PyType_IsSubtype((PyTypeObject *)args[0], &PyTuple_Type) || !PyCallable_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError,
                        "lane_exception_method(handle_type: tuple subclass, fallback)");
        return NULL;
    }
    Py_XSETREF(exception_fallback, Py_NewRef(args[1]));
    return PyDescr_NewMethod((PyTypeObject *)args[0], &lane_handle_exception_def);
}

static PyMethodDef lane_handle_add_done_callback_def = {
    "add_done_callback", (PyCFunction)lane_handle_add_done_callback, METH_O,
    "fn(handle) once acknowledged or failed (on the producer's I/O thread)"};

static PyObject *
speedups_lane_callback_method(PyObject *module, PyObject *type)
{
    if (!PyType_Check(type) || !PyType_IsSubtype((PyTypeObject *)type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "lane_callback_method(): a tuple subclass is needed");
        return NULL;
    }
    return PyDescr_NewMethod((PyTypeObject *)type, &lane_handle_add_done_callback_def);
}

/* ---------------------------------------------------------------- module */

static PyMethodDef speedups_methods[] = {
    {"messages", (PyCFunction)(void (*)(void))speedups_messages, METH_FASTCALL,
     "messages(cls, topic, partition, broker_id, bounds, ids, values, lo, hi) -> iterator"},
    {"record_messages", (PyCFunction)(void (*)(void))speedups_record_messages, METH_FASTCALL,
     "record_messages(cls, topic, partition, broker_id, buf, positions, base, lo, hi) -> "
     "iterator"},
    {"record_values", (PyCFunction)(void (*)(void))speedups_record_values, METH_FASTCALL,
     "record_values(buf, positions, lo, hi) -> list of payloads"},
    {"attach", (PyCFunction)(void (*)(void))speedups_attach, METH_FASTCALL,
     "attach(callbacks, n, starts, slices) -> the callbacks not attached"},
    {"run_callbacks", (PyCFunction)(void (*)(void))speedups_run_callbacks, METH_FASTCALL,
     "run_callbacks(callbacks, no_arg, report): Batch.complete's loop"},
    {"lane_callback_method", (PyCFunction)speedups_lane_callback_method, METH_O,
     "lane_callback_method(handle_type) -> LaneHandle.add_done_callback in C"},
    {"lane_exception_method", (PyCFunction)(void (*)(void))speedups_lane_exception_method,
     METH_FASTCALL, "lane_exception_method(handle_type, fallback) -> LaneHandle.exception in C"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef speedups_module = {
    PyModuleDef_HEAD_INIT, "pymetaq.client._speedups",
    "The client's optional C accelerator (see pymetaq.client.speedups).", -1,
    speedups_methods,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
#define INTERN(var, s) if ((var = PyUnicode_InternFromString(s)) == NULL) return NULL
    INTERN(str_divert, "_divert");
    INTERN(str_owner, "owner");
    INTERN(str_values, "values");
    INTERN(str_nbytes, "nbytes");
    INTERN(str_closed, "closed");
    INTERN(str_attend, "attend");
    INTERN(str_pinned, "pinned");
    INTERN(str_partition, "partition");
    INTERN(str_absorbed, "absorbed");
    INTERN(str_acc, "acc");
    INTERN(str_lock, "_lock");
    INTERN(str_callbacks, "callbacks");
    INTERN(str_locate, "locate");
    INTERN(str_add_callback, "add_callback");
    INTERN(str_acquire, "acquire");
    INTERN(str_release, "release");
    INTERN(str_batch, "batch");
    INTERN(str_starts, "starts");
    INTERN(str_slices, "slices");
    INTERN(str_error, "error");
#undef INTERN
    if (PyType_Ready(&LaneSenderType) < 0 || PyType_Ready(&MessageIterType) < 0 ||
        PyType_Ready(&BodyBufferType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&speedups_module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&LaneSenderType);
    if (PyModule_AddObject(m, "LaneSender", (PyObject *)&LaneSenderType) < 0) {
        Py_DECREF(&LaneSenderType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&BodyBufferType);
    if (PyModule_AddObject(m, "BodyBuffer", (PyObject *)&BodyBufferType) < 0) {
        Py_DECREF(&BodyBufferType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
