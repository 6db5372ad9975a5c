/* The collector door's fast check of an OTLP protobuf trace request (xsp.collector.door).
 *
 * It walks the wire format once and answers only "certainly acceptable" (the span count) or
 * "not sure" (-1). "Certainly acceptable" means the Python check (ingest_view.check: upb's parse
 * of the mirror, then the span rules) would accept the request too: every string is UTF-8, every
 * known field has its own wire type, nothing is nested deeper than MAX_DEPTH, each span's ids and
 * times hold, and each numeric attribute is an int_value inside its column's bounds or a
 * double_value for a float column. Anything else (an unknown field, a numeric string, a wrong
 * wire type, a bad value) is "not sure", and the Python check decides, with its messages. The
 * rules here are stricter than that check (every occurrence of a repeated field is checked, not
 * only the last), never looser.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "wire.h"
#include "keys.h"

#define NOT_SURE (-1)
/* upb allows 100 nested messages; deeper AnyValues are rare enough to leave to the Python check */
#define MAX_DEPTH 64

enum { KIND_WIDE_INT = 0, KIND_INT = 1, KIND_FLOAT = 2, KIND_SPAN_ID_HEX = 3, KINDS };

/* the numeric attributes (and the stored parent), set once by configure() */
static Keys keys;

/* ---- the messages ----------------------------------------------------------------------------- */
static int key_value(Cursor c, int depth, const Key **numeric, Cursor *value);
static int any_value(Cursor c, int depth, int *which, uint64_t *bits, Cursor *text);

/* ArrayValue (of AnyValue) and KeyValueList (of KeyValue) alike: field 1, repeated. */
static int array_or_kvlist(Cursor c, int depth, int of_key_values) {
    if (depth > MAX_DEPTH) return 0;
    while (c.p < c.end) {
        uint32_t number;
        int wire;
        Cursor inner;
        if (!read_tag(&c, &number, &wire) || number != 1 || wire != WIRE_LEN) return 0;
        if (!read_length(&c, &inner)) return 0;
        if (of_key_values) {
            const Key *ignored;
            Cursor value;
            if (!key_value(inner, depth + 1, &ignored, &value)) return 0;
        } else {
            int which;
            uint64_t bits;
            Cursor text;
            if (!any_value(inner, depth + 1, &which, &bits, &text)) return 0;
        }
    }
    return 1;
}

/* AnyValue: which of its fields came last (0: none), with its bits (a varint or a double) or
 * its string. */
static int any_value(Cursor c, int depth, int *which, uint64_t *bits, Cursor *text) {
    if (depth > MAX_DEPTH) return 0;
    *which = 0;
    while (c.p < c.end) {
        uint32_t number;
        int wire;
        Cursor inner;
        if (!read_tag(&c, &number, &wire)) return 0;
        switch (number) {
            case 1: /* string_value */
                if (wire != WIRE_LEN || !read_length(&c, text) || !utf8_valid(text->p, text->end))
                    return 0;
                break;
            case 2: /* bool_value */
            case 3: /* int_value */
                if (wire != WIRE_VARINT || !read_varint(&c, bits)) return 0;
                break;
            case 4: /* double_value */
                if (wire != WIRE_I64 || !read_fixed64(&c, bits)) return 0;
                break;
            case 5: /* array_value */
            case 6: /* kvlist_value */
                if (wire != WIRE_LEN || !read_length(&c, &inner)) return 0;
                if (!array_or_kvlist(inner, depth + 1, number == 6)) return 0;
                break;
            case 7: /* bytes_value */
                if (wire != WIRE_LEN || !read_length(&c, &inner)) return 0;
                break;
            default:
                return 0;
        }
        *which = (int)number;
    }
    return 1;
}

static int key_value(Cursor c, int depth, const Key **numeric, Cursor *value) {
    if (depth > MAX_DEPTH) return 0;
    *numeric = NULL;
    value->p = value->end = NULL;
    int seen_value = 0;
    while (c.p < c.end) {
        uint32_t number;
        int wire;
        Cursor inner;
        if (!read_tag(&c, &number, &wire) || wire != WIRE_LEN || !read_length(&c, &inner)) return 0;
        if (number == 1) {
            if (!utf8_valid(inner.p, inner.end)) return 0;
            *numeric = find_key(&keys, inner.p, (size_t)(inner.end - inner.p));
        } else if (number == 2) {
            int which;
            uint64_t bits;
            Cursor text;
            if (!any_value(inner, depth + 1, &which, &bits, &text)) return 0;
            *value = inner;
            seen_value = 1;
        } else {
            return 0;
        }
    }
    if (!seen_value) value->p = value->end = c.end; /* an empty AnyValue */
    return 1;
}

static int is_hex(const uint8_t *s, const uint8_t *end) {
    for (; s < end; s++) {
        uint8_t b = *s;
        if (!((b >= '0' && b <= '9') || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F'))) return 0;
    }
    return 1;
}

/* A span attribute: well formed, and when it fills a numeric column (or names a stored parent),
 * a value the column certainly takes. */
static int attribute(Cursor c, int depth) {
    const Key *numeric;
    Cursor value;
    if (!key_value(c, depth, &numeric, &value)) return 0;
    if (numeric == NULL) return 1;
    int which;
    uint64_t bits;
    Cursor text;
    if (!any_value(value, depth + 1, &which, &bits, &text)) return 0;
    switch (numeric->kind) {
        case KIND_WIDE_INT:
            return which == 3;
        case KIND_INT: {
            int64_t number = (int64_t)bits;
            return which == 3 && number >= numeric->low && number <= numeric->high;
        }
        case KIND_FLOAT:
            return which == 4;
        case KIND_SPAN_ID_HEX:
            return which == 1 && text.end - text.p == 16 && is_hex(text.p, text.end);
    }
    return 0;
}

/* Attributes, as the messages outside a span hold them: well formed, nothing checked. */
static int plain_attribute(Cursor c, int depth) {
    const Key *ignored;
    Cursor value;
    return key_value(c, depth, &ignored, &value);
}

static int event(Cursor c, int depth) {
    while (c.p < c.end) {
        uint32_t number;
        int wire;
        Cursor inner;
        if (!read_tag(&c, &number, &wire)) return 0;
        if (number == 1 && wire == WIRE_I64) {
            uint64_t ignored;
            if (!read_fixed64(&c, &ignored)) return 0;
        } else if (number == 2 && wire == WIRE_LEN) {
            if (!read_string(&c)) return 0;
        } else if (number == 3 && wire == WIRE_LEN) {
            if (!read_length(&c, &inner) || !plain_attribute(inner, depth + 1)) return 0;
        } else if (number == 4 && wire == WIRE_VARINT) {
            if (!skip_varint(&c)) return 0;
        } else {
            return 0;
        }
    }
    return 1;
}

static int span_link(Cursor c, int depth) {
    Py_ssize_t trace_id = 0, span_id = 0;
    while (c.p < c.end) {
        uint32_t number;
        int wire;
        Cursor inner;
        if (!read_tag(&c, &number, &wire)) return 0;
        if ((number == 1 || number == 2) && wire == WIRE_LEN) {
            if (!read_length(&c, &inner)) return 0;
            if (number == 1) trace_id = inner.end - inner.p;
            else span_id = inner.end - inner.p;
        } else if (number == 3 && wire == WIRE_LEN) {
            if (!read_string(&c)) return 0;
        } else if (number == 4 && wire == WIRE_LEN) {
            if (!read_length(&c, &inner) || !plain_attribute(inner, depth + 1)) return 0;
        } else if (number == 5 && wire == WIRE_VARINT) {
            if (!skip_varint(&c)) return 0;
        } else if (number == 6 && wire == WIRE_I32) {
            if (!skip_fixed32(&c)) return 0;
        } else {
            return 0;
        }
    }
    return trace_id == 16 && span_id == 8;
}

static int status(Cursor c) {
    while (c.p < c.end) {
        uint32_t number;
        int wire;
        if (!read_tag(&c, &number, &wire)) return 0;
        if (number == 2 && wire == WIRE_LEN) {
            if (!read_string(&c)) return 0;
        } else if (number == 3 && wire == WIRE_VARINT) {
            if (!skip_varint(&c)) return 0;
        } else {
            return 0;
        }
    }
    return 1;
}

#define INT64_LIMIT ((uint64_t)INT64_MAX)

static int span(Cursor c, int depth) {
    int ids_ok = 1;
    uint64_t start = 0, end = 0;
    Py_ssize_t trace_id = 0, span_id = 0;
    while (c.p < c.end) {
        uint32_t number;
        int wire;
        Cursor inner;
        if (!read_tag(&c, &number, &wire)) return 0;
        switch (number) {
            case 1: /* trace_id */
            case 2: /* span_id */
            case 4: /* parent_span_id */
                if (wire != WIRE_LEN || !read_length(&c, &inner)) return 0;
                if (number == 1) trace_id = inner.end - inner.p;
                else if (number == 2) span_id = inner.end - inner.p;
                else if (inner.end - inner.p != 0 && inner.end - inner.p != 8) ids_ok = 0;
                break;
            case 3: /* trace_state */
            case 5: /* name */
                if (wire != WIRE_LEN || !read_string(&c)) return 0;
                break;
            case 6: /* kind */
            case 10: /* dropped_attributes_count */
            case 12: /* dropped_events_count */
            case 14: /* dropped_links_count */
                if (wire != WIRE_VARINT || !skip_varint(&c)) return 0;
                break;
            case 7: /* start_time_unix_nano */
            case 8: /* end_time_unix_nano */
                if (wire != WIRE_I64 || !read_fixed64(&c, number == 7 ? &start : &end)) return 0;
                break;
            case 9: /* attributes */
                if (wire != WIRE_LEN || !read_length(&c, &inner) || !attribute(inner, depth + 1))
                    return 0;
                break;
            case 11: /* events */
                if (wire != WIRE_LEN || !read_length(&c, &inner) || !event(inner, depth + 1)) return 0;
                break;
            case 13: /* links */
                if (wire != WIRE_LEN || !read_length(&c, &inner) || !span_link(inner, depth + 1)) return 0;
                break;
            case 15: /* status */
                if (wire != WIRE_LEN || !read_length(&c, &inner) || !status(inner)) return 0;
                break;
            case 16: /* flags */
                if (wire != WIRE_I32 || !skip_fixed32(&c)) return 0;
                break;
            default:
                return 0;
        }
    }
    return ids_ok && trace_id == 16 && span_id == 8 && start <= INT64_LIMIT && end <= INT64_LIMIT &&
           end >= start;
}

/* Resource and InstrumentationScope: their attributes (Resource 1, scope 3), names (scope 1, 2)
 * and dropped counts (Resource 2, scope 4). */
static int resource_or_scope(Cursor c, int depth, int is_scope) {
    while (c.p < c.end) {
        uint32_t number;
        int wire;
        Cursor inner;
        if (!read_tag(&c, &number, &wire)) return 0;
        uint32_t attributes = is_scope ? 3 : 1, dropped = is_scope ? 4 : 2;
        if (number == attributes && wire == WIRE_LEN) {
            if (!read_length(&c, &inner) || !plain_attribute(inner, depth + 1)) return 0;
        } else if (number == dropped && wire == WIRE_VARINT) {
            if (!skip_varint(&c)) return 0;
        } else if (is_scope && (number == 1 || number == 2) && wire == WIRE_LEN) {
            if (!read_string(&c)) return 0;
        } else {
            return 0;
        }
    }
    return 1;
}

/* ResourceSpans (is_scope 0) and ScopeSpans (1) alike: field 1 their Resource or scope, 2
 * their ScopeSpans or Spans, 3 their schema URL. The spans they hold, or NOT_SURE. */
static Py_ssize_t spans_of(Cursor c, int depth, int is_scope) {
    Py_ssize_t count = 0;
    while (c.p < c.end) {
        uint32_t number;
        int wire;
        Cursor inner;
        if (!read_tag(&c, &number, &wire) || wire != WIRE_LEN) return NOT_SURE;
        if (number == 1) {
            if (!read_length(&c, &inner) || !resource_or_scope(inner, depth + 1, is_scope)) return NOT_SURE;
        } else if (number == 2) {
            if (!read_length(&c, &inner)) return NOT_SURE;
            Py_ssize_t spans = is_scope ? (span(inner, depth + 1) ? 1 : NOT_SURE) : spans_of(inner, depth + 1, 1);
            if (spans < 0) return NOT_SURE;
            count += spans;
        } else if (number == 3) {
            if (!read_string(&c)) return NOT_SURE;
        } else {
            return NOT_SURE;
        }
    }
    return count;
}

static Py_ssize_t request(const uint8_t *data, Py_ssize_t length) {
    Cursor c = {data, data + length};
    Py_ssize_t count = 0;
    while (c.p < c.end) {
        uint32_t number;
        int wire;
        Cursor inner;
        if (!read_tag(&c, &number, &wire) || number != 1 || wire != WIRE_LEN) return NOT_SURE;
        if (!read_length(&c, &inner)) return NOT_SURE;
        Py_ssize_t spans = spans_of(inner, 1, 0);
        if (spans < 0) return NOT_SURE;
        count += spans;
    }
    return count;
}

/* ---- Python ---------------------------------------------------------------------------------- */
static PyObject *py_check(PyObject *self, PyObject *arg) {
    Py_buffer view;
    if (!keys.configured) {
        PyErr_SetString(PyExc_RuntimeError, "xsp door: configure() first");
        return NULL;
    }
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) != 0) return NULL;
    Py_ssize_t count;
    Py_BEGIN_ALLOW_THREADS count = request((const uint8_t *)view.buf, view.len);
    Py_END_ALLOW_THREADS PyBuffer_Release(&view);
    return PyLong_FromSsize_t(count);
}

/* configure([(key, kind, low, high), ...]): the attributes whose values are checked. */
static PyObject *py_configure(PyObject *self, PyObject *sequence) {
    if (!configure_keys(&keys, sequence, "xsp door", KINDS)) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"check", py_check, METH_O,
     "The span count of an OTLP trace request that is certainly acceptable, else -1."},
    {"configure", py_configure, METH_O,
     "Set the checked attributes: a sequence of (key, kind, low, high)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "xsp_door", NULL, -1, methods};

PyMODINIT_FUNC PyInit_xsp_door(void) { return PyModule_Create(&module); }
