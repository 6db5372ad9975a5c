/* The protobuf wire format as xsp's native collector modules read it (door.c, span_columns.c):
 * a cursor over a message, its fields' tags and values, UTF-8 strings. Every reader answers 1
 * when the bytes hold what it reads and 0 otherwise (never reading past the cursor's end). */
#ifndef XSP_WIRE_H
#define XSP_WIRE_H
#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum { WIRE_VARINT = 0, WIRE_I64 = 1, WIRE_LEN = 2, WIRE_I32 = 5 };

typedef struct {
    const uint8_t *p, *end;
} Cursor;

static inline uint32_t hash_of(const uint8_t *s, size_t n) {
    uint32_t h = 2166136261u; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 16777619u;
    return h;
}

static inline int read_varint(Cursor *c, uint64_t *out) {
    uint64_t value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (c->p >= c->end) return 0;
        uint8_t byte = *c->p++;
        if (shift == 63 && byte > 1) return 0; /* past 64 bits: protobuf may refuse it */
        value |= (uint64_t)(byte & 0x7F) << shift;
        if (!(byte & 0x80)) {
            *out = value;
            return 1;
        }
    }
    return 0;
}

/* A field's tag; its value is then read with one of the functions below, by wire type. */
static inline int read_tag(Cursor *c, uint32_t *number, int *wire) {
    uint64_t tag;
    if (!read_varint(c, &tag) || (tag >> 3) == 0 || (tag >> 3) > 0x1FFFFFFF) return 0;
    *number = (uint32_t)(tag >> 3);
    *wire = (int)(tag & 7);
    return 1;
}

static inline int read_length(Cursor *c, Cursor *inner) {
    uint64_t n;
    if (!read_varint(c, &n) || n > (uint64_t)(c->end - c->p)) return 0;
    inner->p = c->p;
    inner->end = c->p + n;
    c->p += n;
    return 1;
}

static inline int read_fixed64(Cursor *c, uint64_t *out) {
    if (c->end - c->p < 8) return 0;
    memcpy(out, c->p, 8); /* little-endian hosts only: checked in configure() */
    c->p += 8;
    return 1;
}

static inline int skip_fixed32(Cursor *c) {
    if (c->end - c->p < 4) return 0;
    c->p += 4;
    return 1;
}

static inline int utf8_valid(const uint8_t *s, const uint8_t *end) {
    while (s < end) {
        uint64_t eight;
        if (end - s >= 8 && (memcpy(&eight, s, 8), !(eight & 0x8080808080808080ull))) {
            s += 8; /* eight ASCII bytes: most of every name and key */
            continue;
        }
        uint8_t b = *s;
        if (b < 0x80) {
            s++;
            continue;
        }
        int n;
        uint32_t cp;
        if ((b & 0xE0) == 0xC0) n = 1, cp = b & 0x1F;
        else if ((b & 0xF0) == 0xE0) n = 2, cp = b & 0x0F;
        else if ((b & 0xF8) == 0xF0) n = 3, cp = b & 0x07;
        else return 0;
        if (end - s <= n) return 0;
        for (int i = 1; i <= n; i++) {
            if ((s[i] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (s[i] & 0x3F);
        }
        if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) ||
            cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
        s += n + 1;
    }
    return 1;
}

static inline int read_string(Cursor *c) {
    Cursor s;
    return read_length(c, &s) && utf8_valid(s.p, s.end);
}

static inline int skip_varint(Cursor *c) {
    uint64_t ignored;
    return read_varint(c, &ignored);
}

#endif
