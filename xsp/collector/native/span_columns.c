/* xsp's own encoded spans -> the store's span columns, in C (xsp.collector.span_columns).
 *
 * The store worker's numpy decoder (xsp.tracer.export.otlp_columns.common_columns) reads the
 * spans of a batch field by field with numpy, a few array operations per field: about 3 µs a
 * span. This walks each span's bytes once and writes its values straight into column buffers
 * that arrow then wraps without a copy.
 *
 * It accepts only what the numpy decoder accepts as xsp's common case, and answers "not sure"
 * (None) for anything else; the numpy decoder (and protobuf's own parse after it) then decides.
 * Its rules are that decoder's or stricter, never looser: spans of kind INTERNAL with ids of 16
 * and 8 bytes, a parent of 0 or 8 bytes, times within int64, no trace state, events, flags or
 * dropped counts, at most one link (its two ids, nothing else), a status of UNSET (no message)
 * or ERROR, every field at most once, and every attribute a KeyValue of one key then one value
 * that a column holds, with the column's own value type, once per span. The values are the
 * numpy decoder's, so a table built from either is the same.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "wire.h"
#include "keys.h"

enum { COLUMN_STRING = 0, COLUMN_INT = 1, COLUMN_DOUBLE = 2, COLUMN_KINDS };
/* Span fields (OTLP's numbers) and the one SpanKind the common case holds. */
enum {
    TRACE_ID = 1, SPAN_ID = 2, TRACE_STATE = 3, PARENT = 4, NAME = 5, KIND = 6, START = 7,
    END = 8, ATTRIBUTES = 9, DROPPED_ATTRIBUTES = 10, EVENTS = 11, DROPPED_EVENTS = 12,
    LINKS = 13, DROPPED_LINKS = 14, STATUS = 15, FLAGS = 16
};
#define SPAN_KIND_INTERNAL 1
#define STATUS_UNSET 0
#define STATUS_ERROR 2
/* AnyValue's first byte for each column type: string_value, int_value, double_value. */
static const uint8_t VALUE_TAG[] = {0x0A, 0x18, 0x21};

/* ---- the attribute columns, set once by configure(): decode() numbers them in its order ---- */
static Keys columns_by_key;

static int find_column(const uint8_t *s, size_t n) {
    const Key *key = find_key(&columns_by_key, s, n);
    return key == NULL ? -1 : (int)(key - columns_by_key.keys);
}

/* ---- growable byte buffers ------------------------------------------------------------------ */
typedef struct {
    uint8_t *data;
    size_t length, capacity;
} Bytes;

static int append(Bytes *b, const uint8_t *s, size_t n) {
    if (b->length + n > b->capacity) {
        size_t capacity = b->capacity ? b->capacity : 4096;
        while (capacity < b->length + n) capacity *= 2;
        uint8_t *grown = realloc(b->data, capacity);
        if (grown == NULL) return 0;
        b->data = grown;
        b->capacity = capacity;
    }
    if (n) memcpy(b->data + b->length, s, n);
    b->length += n;
    return 1;
}

/* ---- one decode's columns ------------------------------------------------------------------- */
typedef struct {
    int used;
    Py_ssize_t last_row;  /* the row of the last value: a key twice in a span is not sure */
    Py_ssize_t nulls;
    uint8_t *valid;       /* arrow's validity bitmap */
    uint8_t *values;      /* int64 / float64 values, or a string column's int32 offsets */
    Py_ssize_t filled;    /* a string column: the rows whose offsets are written */
    Bytes text;
} Column;

typedef struct {
    Py_ssize_t row;
    const uint8_t *p;
    size_t length;
} Error;

typedef struct {
    Py_ssize_t n;
    uint8_t *trace_ids;
    uint64_t *span_ids, *parent_ids;
    int64_t *start_ns, *dur_ns;
    int32_t *name_offsets;
    Bytes names;
    uint8_t *link_valid, *link_traces;
    uint64_t *link_spans;
    Py_ssize_t links;
    Error *errors;
    Py_ssize_t error_count;
    Column columns[MAX_KEYS];
    int out_of_memory;
} Decoded;

static void set_valid(uint8_t *bitmap, Py_ssize_t row) { bitmap[row >> 3] |= (uint8_t)(1u << (row & 7)); }

static uint64_t big_endian64(const uint8_t *p) {
    uint64_t value = 0;
    for (int i = 0; i < 8; i++) value = (value << 8) | p[i];
    return value;
}

static int string_offsets_to(Column *column, Py_ssize_t rows) {
    int32_t *offsets = (int32_t *)column->values;
    if (column->text.length > INT32_MAX) return 0;
    for (Py_ssize_t row = column->filled; row < rows; row++) offsets[row + 1] = (int32_t)column->text.length;
    column->filled = rows;
    return 1;
}

static Column *use_column(Decoded *d, int index) {
    Column *column = &d->columns[index];
    if (column->used) return column;
    Py_ssize_t n = d->n;
    int text = columns_by_key.keys[index].kind == COLUMN_STRING;
    column->valid = calloc((size_t)(n + 7) / 8 + 1, 1);
    column->values = calloc((size_t)n + 1, text ? sizeof(int32_t) : sizeof(int64_t));
    if (column->valid == NULL || column->values == NULL) {
        d->out_of_memory = 1;
        return NULL;
    }
    column->used = 1;
    column->last_row = -1;
    return column;
}

/* One KeyValue: field 1 (the key) then field 2 (an AnyValue of one field), nothing else. */
static int attribute(Decoded *d, Cursor c, Py_ssize_t row) {
    Cursor key, value;
    if (c.p >= c.end || *c.p++ != 0x0A || !read_length(&c, &key)) return 0;
    if (c.p >= c.end || *c.p++ != 0x12 || !read_length(&c, &value) || c.p != c.end) return 0;
    int index = find_column(key.p, (size_t)(key.end - key.p));
    if (index < 0 || value.p >= value.end) return 0;
    const Key *spec = &columns_by_key.keys[index];
    if (*value.p++ != VALUE_TAG[spec->kind]) return 0;
    Column *column = use_column(d, index);
    if (column == NULL || column->last_row == row) return 0;
    column->last_row = row;
    set_valid(column->valid, row);
    if (spec->kind == COLUMN_STRING) {
        Cursor text;
        if (!read_length(&value, &text) || value.p != value.end || !utf8_valid(text.p, text.end))
            return 0;
        if (!string_offsets_to(column, row)) return 0;
        if (!append(&column->text, text.p, (size_t)(text.end - text.p))) {
            d->out_of_memory = 1;
            return 0;
        }
        return string_offsets_to(column, row + 1);
    }
    uint64_t bits;
    if (spec->kind == COLUMN_INT) {
        if (!read_varint(&value, &bits) || value.p != value.end) return 0;
        int64_t number = (int64_t)bits;
        if (number < spec->low || number > spec->high) return 0;
    } else if (!read_fixed64(&value, &bits) || value.p != value.end) {
        return 0;
    }
    memcpy(column->values + (size_t)row * 8, &bits, 8);
    return 1;
}

/* A Link of the two ids only. */
static int span_link(Decoded *d, Cursor c, Py_ssize_t row) {
    int seen = 0;
    while (c.p < c.end) {
        uint32_t number;
        int wire;
        Cursor id;
        if (!read_tag(&c, &number, &wire) || wire != WIRE_LEN || !read_length(&c, &id)) return 0;
        size_t size = (size_t)(id.end - id.p);
        if (number == 1 && !(seen & 1) && size == 16) {
            memcpy(d->link_traces + (size_t)row * 16, id.p, 16);
        } else if (number == 2 && !(seen & 2) && size == 8) {
            d->link_spans[row] = big_endian64(id.p);
        } else {
            return 0;
        }
        seen |= (int)number;
    }
    if (seen != 3) return 0;
    set_valid(d->link_valid, row);
    d->links++;
    return 1;
}

/* A Status of UNSET without a message, or of ERROR (its message kept, "" where absent). */
static int status(Decoded *d, Cursor c, Py_ssize_t row) {
    uint64_t code = STATUS_UNSET;
    Cursor message = {c.p, c.p};
    int seen = 0;
    while (c.p < c.end) {
        uint32_t number;
        int wire;
        if (!read_tag(&c, &number, &wire)) return 0;
        if (number == 2 && wire == WIRE_LEN && !(seen & 1)) {
            if (!read_length(&c, &message)) return 0;
            seen |= 1;
        } else if (number == 3 && wire == WIRE_VARINT && !(seen & 2)) {
            if (!read_varint(&c, &code)) return 0;
            seen |= 2;
        } else {
            return 0;
        }
    }
    if (code == STATUS_UNSET) return message.p == message.end;
    if (code != STATUS_ERROR || !utf8_valid(message.p, message.end)) return 0;
    Error *error = &d->errors[d->error_count++];
    error->row = row;
    error->p = message.p;
    error->length = (size_t)(message.end - message.p);
    return 1;
}

static int span(Decoded *d, Cursor c, Py_ssize_t row) {
    uint32_t seen = 0; /* the fields read so far, by number: each at most once */
    uint64_t start = 0, end = 0, kind = 0;
    Cursor name = {c.p, c.p};
    while (c.p < c.end) {
        uint32_t number;
        int wire;
        Cursor inner;
        uint64_t value;
        if (!read_tag(&c, &number, &wire) || number > FLAGS) return 0;
        if (number != ATTRIBUTES) {
            if (seen & (1u << number)) return 0;
            seen |= 1u << number;
        }
        switch (number) {
            case TRACE_ID:
                if (wire != WIRE_LEN || !read_length(&c, &inner) || inner.end - inner.p != 16) return 0;
                memcpy(d->trace_ids + (size_t)row * 16, inner.p, 16);
                break;
            case SPAN_ID:
                if (wire != WIRE_LEN || !read_length(&c, &inner) || inner.end - inner.p != 8) return 0;
                d->span_ids[row] = big_endian64(inner.p);
                break;
            case PARENT:
                if (wire != WIRE_LEN || !read_length(&c, &inner)) return 0;
                if (inner.end - inner.p == 8) d->parent_ids[row] = big_endian64(inner.p);
                else if (inner.end != inner.p) return 0;
                break;
            case NAME:
                if (wire != WIRE_LEN || !read_length(&c, &name) || !utf8_valid(name.p, name.end)) return 0;
                break;
            case KIND:
                if (wire != WIRE_VARINT || !read_varint(&c, &kind)) return 0;
                break;
            case START:
            case END:
                if (wire != WIRE_I64 || !read_fixed64(&c, number == START ? &start : &end)) return 0;
                break;
            case ATTRIBUTES:
                if (wire != WIRE_LEN || !read_length(&c, &inner) || !attribute(d, inner, row)) return 0;
                break;
            case DROPPED_ATTRIBUTES:
            case DROPPED_EVENTS:
            case DROPPED_LINKS:
                if (wire != WIRE_VARINT || !read_varint(&c, &value) || value != 0) return 0;
                break;
            case LINKS:
                if (wire != WIRE_LEN || !read_length(&c, &inner) || !span_link(d, inner, row)) return 0;
                break;
            case STATUS:
                if (wire != WIRE_LEN || !read_length(&c, &inner) || !status(d, inner, row)) return 0;
                break;
            case FLAGS:
                if (wire != WIRE_I32 || c.end - c.p < 4 || memcmp(c.p, "\0\0\0\0", 4) != 0) return 0;
                c.p += 4;
                break;
            default: /* trace state, events, anything else */
                return 0;
        }
    }
    if (!(seen & (1u << TRACE_ID)) || !(seen & (1u << SPAN_ID)) || kind != SPAN_KIND_INTERNAL)
        return 0;
    if (start > (uint64_t)INT64_MAX || end > (uint64_t)INT64_MAX) return 0;
    d->start_ns[row] = (int64_t)start;
    d->dur_ns[row] = end > start ? (int64_t)(end - start) : 0;
    if (!append(&d->names, name.p, (size_t)(name.end - name.p))) {
        d->out_of_memory = 1;
        return 0;
    }
    if (d->names.length > INT32_MAX) return 0; /* past arrow's 32-bit offsets */
    d->name_offsets[row + 1] = (int32_t)d->names.length;
    return 1;
}

static int allocate(Decoded *d, Py_ssize_t n) {
    size_t rows = (size_t)n + 1;
    d->n = n;
    d->trace_ids = calloc(rows, 16);
    d->span_ids = calloc(rows, 8);
    d->parent_ids = calloc(rows, 8);
    d->start_ns = calloc(rows, 8);
    d->dur_ns = calloc(rows, 8);
    d->name_offsets = calloc(rows, 4);
    d->link_valid = calloc(rows / 8 + 1, 1);
    d->link_traces = calloc(rows, 16);
    d->link_spans = calloc(rows, 8);
    d->errors = calloc(rows, sizeof(Error));
    return d->trace_ids && d->span_ids && d->parent_ids && d->start_ns && d->dur_ns &&
           d->name_offsets && d->link_valid && d->link_traces && d->link_spans && d->errors;
}

static void release(Decoded *d) {
    free(d->trace_ids);
    free(d->span_ids);
    free(d->parent_ids);
    free(d->start_ns);
    free(d->dur_ns);
    free(d->name_offsets);
    free(d->names.data);
    free(d->link_valid);
    free(d->link_traces);
    free(d->link_spans);
    free(d->errors);
    for (Py_ssize_t i = 0; i < columns_by_key.count; i++) {
        free(d->columns[i].valid);
        free(d->columns[i].values);
        free(d->columns[i].text.data);
    }
}

/* ---- Python ---------------------------------------------------------------------------------- */
static PyObject *bytes_of(const void *p, size_t n) { return PyBytes_FromStringAndSize((const char *)p, (Py_ssize_t)n); }

static PyObject *columns_of(Decoded *d) {
    Py_ssize_t n = d->n;
    size_t bitmap = (size_t)(n + 7) / 8;
    PyObject *attributes = PyList_New(0);
    if (attributes == NULL) return NULL;
    for (Py_ssize_t i = 0; i < columns_by_key.count; i++) {
        Column *column = &d->columns[i];
        if (!column->used) continue;
        int text = columns_by_key.keys[i].kind == COLUMN_STRING;
        if (text && !string_offsets_to(column, n)) {
            Py_DECREF(attributes);
            Py_RETURN_NONE;
        }
        Py_ssize_t present = 0;
        for (size_t k = 0; k < bitmap; k++) present += __builtin_popcount(column->valid[k]);
        PyObject *item = Py_BuildValue(
            "(nnNNN)", i, n - present, bytes_of(column->valid, bitmap),
            bytes_of(column->values, (size_t)(n + text) * (text ? 4 : 8)),
            text ? bytes_of(column->text.data, column->text.length) : Py_NewRef(Py_None));
        if (item == NULL || PyList_Append(attributes, item) != 0) {
            Py_XDECREF(item);
            Py_DECREF(attributes);
            return NULL;
        }
        Py_DECREF(item);
    }
    PyObject *errors = PyList_New(d->error_count);
    if (errors == NULL) {
        Py_DECREF(attributes);
        return NULL;
    }
    for (Py_ssize_t k = 0; k < d->error_count; k++) {
        PyObject *message = PyUnicode_DecodeUTF8((const char *)d->errors[k].p, (Py_ssize_t)d->errors[k].length, NULL);
        PyObject *pair = message ? Py_BuildValue("(nN)", d->errors[k].row, message) : NULL;
        if (pair == NULL) {
            Py_DECREF(errors);
            Py_DECREF(attributes);
            return NULL;
        }
        PyList_SET_ITEM(errors, k, pair);
    }
    PyObject *links = d->links == 0 ? Py_NewRef(Py_None)
                                    : Py_BuildValue("(nNNN)", n - d->links, bytes_of(d->link_valid, bitmap),
                                                    bytes_of(d->link_traces, (size_t)n * 16),
                                                    bytes_of(d->link_spans, (size_t)n * 8));
    if (links == NULL) {
        Py_DECREF(errors);
        Py_DECREF(attributes);
        return NULL;
    }
    return Py_BuildValue(
        "{sNsNsNsNsNsNsNsNsNsN}", "trace_id", bytes_of(d->trace_ids, (size_t)n * 16), "span_id",
        bytes_of(d->span_ids, (size_t)n * 8), "parent_span_id", bytes_of(d->parent_ids, (size_t)n * 8),
        "start_ns", bytes_of(d->start_ns, (size_t)n * 8), "dur_ns", bytes_of(d->dur_ns, (size_t)n * 8),
        "name_offsets", bytes_of(d->name_offsets, (size_t)(n + 1) * 4), "names",
        bytes_of(d->names.data, d->names.length), "errors", errors, "links", links, "attributes",
        attributes);
}

/* decode(spans): the columns of a list of encoded spans, or None where one is not xsp's
 * common case. */
static PyObject *py_decode(PyObject *self, PyObject *arg) {
    if (!columns_by_key.configured) {
        PyErr_SetString(PyExc_RuntimeError, "xsp span columns: configure() first");
        return NULL;
    }
    PyObject *items = PySequence_Fast(arg, "decode() takes a sequence of bytes");
    if (items == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(items);
    Cursor *spans = malloc(((size_t)n + 1) * sizeof(Cursor));
    Decoded *d = calloc(1, sizeof(Decoded));
    if (spans == NULL || d == NULL || !allocate(d, n)) {
        free(spans);
        if (d) release(d);
        free(d);
        Py_DECREF(items);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(items, i);
        if (!PyBytes_Check(item)) {
            free(spans);
            release(d);
            free(d);
            Py_DECREF(items);
            PyErr_SetString(PyExc_TypeError, "decode() takes a sequence of bytes");
            return NULL;
        }
        spans[i].p = (const uint8_t *)PyBytes_AS_STRING(item);
        spans[i].end = spans[i].p + PyBytes_GET_SIZE(item);
    }
    int common = 1;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n && common; i++) common = span(d, spans[i], i);
    Py_END_ALLOW_THREADS
    PyObject *out;
    if (d->out_of_memory) out = PyErr_NoMemory();
    else if (!common) out = Py_NewRef(Py_None);
    else out = columns_of(d);
    free(spans);
    release(d);
    free(d);
    Py_DECREF(items); /* the spans' bytes lived until here: the cursors point into them */
    return out;
}

/* configure([(key, kind, low, high), ...]): the attribute columns, in the order decode() numbers
 * them; kind 0 string, 1 int (within [low, high]), 2 double. */
static PyObject *py_configure(PyObject *self, PyObject *sequence) {
    if (!configure_keys(&columns_by_key, sequence, "xsp span columns", COLUMN_KINDS)) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"decode", py_decode, METH_O, "The columns of a list of encoded spans, or None where one is not xsp's common case."},
    {"configure", py_configure, METH_O, "Set the attribute columns: a sequence of (key, kind, low, high)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "xsp_span_columns", NULL, -1, methods};

PyMODINIT_FUNC PyInit_xsp_span_columns(void) { return PyModule_Create(&module); }
