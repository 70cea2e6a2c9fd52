/* pymetaq.storage._speedups: the record format's optional C accelerator.
 *
 * Each function is the exact equivalent of a pure-Python one that stays the reference and the
 * fallback (pymetaq.storage.speedups picks one; the tests compare them):
 *
 *   crc32(data, value=0) -> int
 *       zlib.crc32's result: carry-less multiplication (PCLMULQDQ) folding 16 bytes at a time
 *       where the CPU has it (x86-64), slicing-by-8 tables for the rest and elsewhere.
 *       CRC32_IMPL names the one in use: "pclmul" or "slicing-by-8".
 *
 *   record_parts(values) -> (parts, total)
 *       MetaQ records for a list of payloads, as a producer batches them:
 *       parts = [header0, value0, header1, value1, ...], each header the 20 bytes
 *       ">iiqi" (len, CRC32(value) & 0x7FFFFFFF, id 0, flag 0); total = sum of 20 + len.
 *       Python: storage.record.record_parts_py.
 *
 *   uniform_crc_mismatch(buf, stride, n) -> int
 *       The index of the first of n records of stride bytes at the start of buf whose stored
 *       CRC (bytes 4..7, big-endian) is not CRC32(bytes 20..stride) & 0x7FFFFFFF; -1: none.
 *       The caller has checked that n * stride <= len(buf) and stride >= 20.
 *       Python: storage.batch._check_uniform. The consumer's scan uses it. Releases the GIL.
 *
 *   uniform_scan(buf, max_data, max_records) -> (code, stride, n, index)
 *       The broker's checks of a uniform batch (storage.batch.stamp_batch's uniform branch,
 *       in its order): every record of buf has the first record's length (the length fields
 *       equal, that length < 2^31, n = len(buf) / stride records exactly), then that length
 *       is <= max_data (-1: no limit), then n <= max_records, then every stored CRC matches,
 *       then whether any record has a flag. code: 0 all checks passed, no flags; 1 not
 *       uniform (nothing else checked; stride and n are 0); 2 a record longer than max_data;
 *       3 more than max_records records; 4 the CRC of record index does not match; 5 all
 *       checks passed and some record has a flag (the caller checks the flags). Releases the
 *       GIL while the CRCs of a batch of 64 KiB or more are computed.
 *       Python: storage.batch._uniform, _check_count, _check_uniform.
 *
 *   stamp_uniform(buf, stride, n, first_id) -> None
 *       Writes ids first_id, first_id + 1, ... (big-endian int64) at byte 8 of each of the n
 *       records of stride bytes at the start of buf (a writable buffer).
 *       Python: storage.batch._stamp_uniform.
 *
 *   index_records(buf, max_record, verify) -> (positions, status)
 *       Walks the complete plain records at the start of buf, as the consumer's scan does
 *       (client.consumer.scan: the reference). positions is a bytes object of native int64s:
 *       where each complete valid record starts, then where the walk stopped (n + 1 of them).
 *       status says why it stopped: 0 the end of buf or a partial record, 1 a record with a
 *       flag, 2 a length < 0 or > max_record, 3 a stored CRC that is not CRC32(data) &
 *       0x7FFFFFFF (checked only when verify is true). Checked in that order, per record.
 *       Releases the GIL while it runs.
 *
 * Thread-safety: the CRC tables and the CPU check are written once, at import; the functions
 * keep no state.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* ---------------------------------------------------------------- CRC32 (zlib's) */

static uint32_t crc_table[8][256];

static void
crc_init(void)
{
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = crc_table[0][n];
        for (int k = 1; k < 8; k++) {
            c = crc_table[0][c & 0xff] ^ (c >> 8);
            crc_table[k][n] = c;
        }
    }
}

/* PCLMULQDQ folding (Intel, "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ
 * Instruction", 2009; the bit-reflected constants of its appendix for CRC32's polynomial, as
 * in zlib's and Chromium's crc32_simd.c). Four 128-bit lanes fold 64 bytes per step, then
 * one lane 16 bytes per step, then the 128-bit remainder is reduced to 64 and Barrett-reduced
 * to 32 bits. Takes and returns the *internal* (inverted) CRC register; len >= 64 and a
 * multiple of 16. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_CLMUL 1
#include <immintrin.h>

static int use_clmul;

__attribute__((target("pclmul,sse4.1"))) static uint32_t
crc32_clmul(const unsigned char *buf, size_t len, uint32_t crc)
{
    const __m128i k1k2 = _mm_set_epi64x(0x01c6e41596, 0x0154442bd4);
    const __m128i k3k4 = _mm_set_epi64x(0x00ccaa009e, 0x01751997d0);
    const __m128i k5k0 = _mm_set_epi64x(0, 0x0163cd6124);
    const __m128i poly = _mm_set_epi64x(0x01f7011641, 0x01db710641);
    const __m128i mask32 = _mm_setr_epi32(~0, 0, ~0, 0);
    __m128i x0, x1, x2, x3, x4, x5, x6, x7, x8;

    x1 = _mm_loadu_si128((const __m128i *)(buf + 0x00));
    x2 = _mm_loadu_si128((const __m128i *)(buf + 0x10));
    x3 = _mm_loadu_si128((const __m128i *)(buf + 0x20));
    x4 = _mm_loadu_si128((const __m128i *)(buf + 0x30));
    x1 = _mm_xor_si128(x1, _mm_cvtsi32_si128((int)crc));
    buf += 64;
    len -= 64;
    x0 = k1k2;
    while (len >= 64) {
        x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
        x6 = _mm_clmulepi64_si128(x2, x0, 0x00);
        x7 = _mm_clmulepi64_si128(x3, x0, 0x00);
        x8 = _mm_clmulepi64_si128(x4, x0, 0x00);
        x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
        x2 = _mm_clmulepi64_si128(x2, x0, 0x11);
        x3 = _mm_clmulepi64_si128(x3, x0, 0x11);
        x4 = _mm_clmulepi64_si128(x4, x0, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x5), _mm_loadu_si128((const __m128i *)(buf + 0x00)));
        x2 = _mm_xor_si128(_mm_xor_si128(x2, x6), _mm_loadu_si128((const __m128i *)(buf + 0x10)));
        x3 = _mm_xor_si128(_mm_xor_si128(x3, x7), _mm_loadu_si128((const __m128i *)(buf + 0x20)));
        x4 = _mm_xor_si128(_mm_xor_si128(x4, x8), _mm_loadu_si128((const __m128i *)(buf + 0x30)));
        buf += 64;
        len -= 64;
    }
    /* the four lanes into one */
    x0 = k3k4;
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x3), x5);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x4), x5);
    while (len >= 16) {
        x2 = _mm_loadu_si128((const __m128i *)buf);
        x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
        x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
        buf += 16;
        len -= 16;
    }
    /* 128 bits to 64 */
    x2 = _mm_clmulepi64_si128(x1, x0, 0x10);
    x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), x2);
    x0 = k5k0;
    x2 = _mm_srli_si128(x1, 4);
    x1 = _mm_and_si128(x1, mask32);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    /* Barrett reduction to 32 bits */
    x0 = poly;
    x2 = _mm_and_si128(x1, mask32);
    x2 = _mm_clmulepi64_si128(x2, x0, 0x10);
    x2 = _mm_and_si128(x2, mask32);
    x2 = _mm_clmulepi64_si128(x2, x0, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    return (uint32_t)_mm_extract_epi32(x1, 1);
}
#endif

static uint32_t
crc32_update(uint32_t crc, const unsigned char *p, size_t n)
{
    crc = ~crc;
#ifdef HAVE_CLMUL
    if (use_clmul && n >= 64) {
        size_t chunk = n & ~(size_t)15;
        crc = crc32_clmul(p, chunk, crc);
        p += chunk;
        n -= chunk;
    }
#endif
#if PY_LITTLE_ENDIAN
    while (n >= 8) {
        uint32_t one, two;
        memcpy(&one, p, 4);
        memcpy(&two, p + 4, 4);
        one ^= crc;
        crc = crc_table[7][one & 0xff] ^ crc_table[6][(one >> 8) & 0xff] ^
              crc_table[5][(one >> 16) & 0xff] ^ crc_table[4][one >> 24] ^
              crc_table[3][two & 0xff] ^ crc_table[2][(two >> 8) & 0xff] ^
              crc_table[1][(two >> 16) & 0xff] ^ crc_table[0][two >> 24];
        p += 8;
        n -= 8;
    }
#endif
    while (n--)
        crc = crc_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return ~crc;
}

static PyObject *
speedups_crc32(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "crc32(data, value=0)");
        return NULL;
    }
    uint32_t start = 0;
    if (nargs == 2) {
        start = (uint32_t)PyLong_AsUnsignedLongMask(args[1]);
        if (PyErr_Occurred())
            return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    uint32_t crc = crc32_update(start, view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(crc);
}

/* ---------------------------------------------------------------- record_parts */

static inline void
put_be32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static PyObject *
speedups_record_parts(PyObject *module, PyObject *values)
{
    if (!PyList_CheckExact(values)) {
        PyErr_SetString(PyExc_TypeError, "record_parts() takes a list of bytes");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(values);
    PyObject *parts = PyList_New(2 * n);
    if (parts == NULL)
        return NULL;
    long long total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyList_GET_ITEM(values, i);
        if (!PyBytes_Check(v)) {
            Py_DECREF(parts);
            PyErr_Format(PyExc_TypeError, "record_parts(): item %zd is not bytes", i);
            return NULL;
        }
        Py_ssize_t len = PyBytes_GET_SIZE(v);
        if (len > INT32_MAX) {
            Py_DECREF(parts);
            PyErr_SetString(PyExc_OverflowError, "record_parts(): a value over 2 GiB");
            return NULL;
        }
        PyObject *h = PyBytes_FromStringAndSize(NULL, 20);
        if (h == NULL) {
            Py_DECREF(parts);
            return NULL;
        }
        unsigned char *p = (unsigned char *)PyBytes_AS_STRING(h);
        uint32_t crc = crc32_update(0, (const unsigned char *)PyBytes_AS_STRING(v), (size_t)len);
        put_be32(p, (uint32_t)len);
        put_be32(p + 4, crc & 0x7FFFFFFFu);
        memset(p + 8, 0, 12);
        PyList_SET_ITEM(parts, 2 * i, h);
        Py_INCREF(v);
        PyList_SET_ITEM(parts, 2 * i + 1, v);
        total += 20 + len;
    }
    PyObject *tot = PyLong_FromLongLong(total);
    if (tot == NULL) {
        Py_DECREF(parts);
        return NULL;
    }
    PyObject *out = PyTuple_Pack(2, parts, tot);
    Py_DECREF(parts);
    Py_DECREF(tot);
    return out;
}

/* ---------------------------------------------------------------- uniform_crc_mismatch */

static inline uint32_t
get_be32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

/* The index of the first of n records of stride bytes at b whose stored CRC does not match
 * its data, or -1; *flagged (when not NULL) is set if a record before it, or any record when
 * there is none, has a flag. */
static Py_ssize_t
first_bad_crc(const unsigned char *b, Py_ssize_t stride, Py_ssize_t n, int *flagged)
{
    const size_t data = (size_t)(stride - 20);
    int flags = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        const unsigned char *rec = b + k * stride;
        if ((crc32_update(0, rec + 20, data) & 0x7FFFFFFFu) != get_be32(rec + 4))
            return k;
        flags |= get_be32(rec + 16) != 0;
    }
    if (flagged != NULL)
        *flagged = flags;
    return -1;
}

/* args[1] and args[2] as stride and n, and a view of args[0] (flags: PyBUF_SIMPLE or
 * PyBUF_WRITABLE) holding n records of stride bytes; 0, or -1 with an exception set. */
static int
records_view(PyObject *const *args, int flags, const char *who, Py_buffer *view,
             Py_ssize_t *stride, Py_ssize_t *n)
{
    *stride = PyLong_AsSsize_t(args[1]);
    if (*stride == -1 && PyErr_Occurred())
        return -1;
    *n = PyLong_AsSsize_t(args[2]);
    if (*n == -1 && PyErr_Occurred())
        return -1;
    if (PyObject_GetBuffer(args[0], view, flags) < 0)
        return -1;
    if (*stride < 20 || *n < 0 || (*n > 0 && *stride > view->len / *n)) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_ValueError, "%s(): n records of stride do not fit", who);
        return -1;
    }
    return 0;
}

static PyObject *
speedups_uniform_crc_mismatch(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "uniform_crc_mismatch(buf, stride, n)");
        return NULL;
    }
    Py_buffer view;
    Py_ssize_t stride, n;
    if (records_view(args, PyBUF_SIMPLE, "uniform_crc_mismatch", &view, &stride, &n) < 0)
        return NULL;
    const unsigned char *base = view.buf;
    Py_ssize_t bad;
    Py_BEGIN_ALLOW_THREADS
    bad = first_bad_crc(base, stride, n, NULL);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(bad);
}

/* ---------------------------------------------------------------- uniform_scan, stamp_uniform */

#define UNIFORM_GIL_BYTES (64 * 1024)

static PyObject *
speedups_uniform_scan(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "uniform_scan(buf, max_data, max_records)");
        return NULL;
    }
    long long max_data = PyLong_AsLongLong(args[1]);
    if (max_data == -1 && PyErr_Occurred())
        return NULL;
    long long max_records = PyLong_AsLongLong(args[2]);
    if (max_records == -1 && PyErr_Occurred())
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *b = view.buf;
    const Py_ssize_t end = view.len;
    int code = 1;
    Py_ssize_t stride = 0, n = 0, index = -1;
    if (end >= 20) {
        uint32_t length = get_be32(b);
        if (length < 0x80000000u) {
            stride = 20 + (Py_ssize_t)length;
            n = end / stride;
            if (end % stride == 0) {
                code = 0;
                for (Py_ssize_t k = 1; k < n; k++) {
                    if (memcmp(b + k * stride, b, 4) != 0) {
                        code = 1;
                        break;
                    }
                }
            }
        }
        if (code == 1)
            stride = n = 0;
    }
    if (code == 0 && max_data >= 0 && (long long)(stride - 20) > max_data)
        code = 2;
    else if (code == 0 && (long long)n > max_records)
        code = 3;
    if (code == 0) {
        int flagged = 0;
        Py_ssize_t bad;
        if (end >= UNIFORM_GIL_BYTES) {
            Py_BEGIN_ALLOW_THREADS
            bad = first_bad_crc(b, stride, n, &flagged);
            Py_END_ALLOW_THREADS
        } else {
            bad = first_bad_crc(b, stride, n, &flagged);
        }
        if (bad >= 0) {
            code = 4;
            index = bad;
        } else if (flagged) {
            code = 5;
        }
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("(innn)", code, stride, n, index);
}

static PyObject *
speedups_stamp_uniform(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "stamp_uniform(buf, stride, n, first_id)");
        return NULL;
    }
    long long first = PyLong_AsLongLong(args[3]);
    if (first == -1 && PyErr_Occurred())
        return NULL;
    Py_buffer view;
    Py_ssize_t stride, n;
    if (records_view(args, PyBUF_WRITABLE, "stamp_uniform", &view, &stride, &n) < 0)
        return NULL;
    unsigned char *b = view.buf;
    for (Py_ssize_t k = 0; k < n; k++) {
        uint64_t id = (uint64_t)first + (uint64_t)k;
        unsigned char *p = b + k * stride + 8;
        for (int i = 7; i >= 0; i--) {
            p[i] = (unsigned char)(id & 0xff);
            id >>= 8;
        }
    }
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------- index_records */

static PyObject *
speedups_index_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "index_records(buf, max_record, verify)");
        return NULL;
    }
    long long max_record = PyLong_AsLongLong(args[1]);
    if (max_record == -1 && PyErr_Occurred())
        return NULL;
    int verify = PyObject_IsTrue(args[2]);
    if (verify < 0)
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *b = view.buf;
    const Py_ssize_t end = view.len;
    /* room for the positions of a reply of 100-byte records, grown by doubling */
    Py_ssize_t cap = end / 120 + 2, n = 0, p = 0;
    int64_t *pos = PyMem_RawMalloc((size_t)cap * sizeof(int64_t));
    if (pos == NULL) {
        PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
    int status = 0;
    Py_BEGIN_ALLOW_THREADS
    while (end - p >= 20) {
        const unsigned char *r = b + p;
        int32_t length = (int32_t)get_be32(r);
        if (get_be32(r + 16) != 0) {
            status = 1;
            break;
        }
        if (length < 0 || (long long)length > max_record) {
            status = 2;
            break;
        }
        if ((Py_ssize_t)length > end - p - 20)
            break; /* a partial record */
        if (verify && (crc32_update(0, r + 20, (size_t)length) & 0x7FFFFFFFu) != get_be32(r + 4)) {
            status = 3;
            break;
        }
        if (n + 2 > cap) {
            int64_t *more = PyMem_RawRealloc(pos, (size_t)(2 * cap) * sizeof(int64_t));
            if (more == NULL) {
                status = -1;
                break;
            }
            pos = more;
            cap *= 2;
        }
        pos[n++] = p;
        p += 20 + (Py_ssize_t)length;
    }
    pos[n] = p;
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    PyObject *out = NULL;
    if (status < 0)
        PyErr_NoMemory();
    else
        out = Py_BuildValue("(y#i)", (const char *)pos, (Py_ssize_t)((n + 1) * sizeof(int64_t)),
                            status);
    PyMem_RawFree(pos);
    return out;
}

/* ---------------------------------------------------------------- module */

static PyMethodDef speedups_methods[] = {
    {"crc32", (PyCFunction)(void (*)(void))speedups_crc32, METH_FASTCALL,
     "crc32(data, value=0) -> int: zlib.crc32's result"},
    {"record_parts", (PyCFunction)speedups_record_parts, METH_O,
     "record_parts(values) -> (parts, total): [header, value, ...] and their bytes"},
    {"uniform_crc_mismatch", (PyCFunction)(void (*)(void))speedups_uniform_crc_mismatch,
     METH_FASTCALL, "uniform_crc_mismatch(buf, stride, n) -> first bad record's index, or -1"},
    {"uniform_scan", (PyCFunction)(void (*)(void))speedups_uniform_scan, METH_FASTCALL,
     "uniform_scan(buf, max_data, max_records) -> (code, stride, n, index): see the module comment"},
    {"stamp_uniform", (PyCFunction)(void (*)(void))speedups_stamp_uniform, METH_FASTCALL,
     "stamp_uniform(buf, stride, n, first_id) -> None: ids first_id.. at byte 8 of each record"},
    {"index_records", (PyCFunction)(void (*)(void))speedups_index_records, METH_FASTCALL,
     "index_records(buf, max_record, verify) -> (positions, status): see the module comment"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef speedups_module = {
    PyModuleDef_HEAD_INIT, "pymetaq.storage._speedups",
    "The record format's optional C accelerator (see pymetaq.storage.speedups).", -1,
    speedups_methods,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    crc_init();
    const char *impl = "slicing-by-8";
#ifdef HAVE_CLMUL
    __builtin_cpu_init();
    use_clmul = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
    if (use_clmul)
        impl = "pclmul";
#endif
    PyObject *m = PyModule_Create(&speedups_module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddStringConstant(m, "CRC32_IMPL", impl) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
