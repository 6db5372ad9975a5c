/* The attribute keys a native collector module looks values up by (door.c, span_columns.c):
 * the (key, kind, low, high) tuples its configure() was given, in their order, found by a key's
 * bytes. What a kind means is the module's own. Include after Python.h and wire.h. */
#ifndef XSP_KEYS_H
#define XSP_KEYS_H

#define MAX_KEYS 128
#define KEY_SLOTS 512 /* a power of two, more than twice MAX_KEYS */

typedef struct {
    char *key;
    size_t length;
    int kind;
    int64_t low, high;
} Key;

typedef struct {
    Key keys[MAX_KEYS];
    int slots[KEY_SLOTS]; /* a key's hash -> its index + 1 (0: empty) */
    Py_ssize_t count;
    int configured;
} Keys;

static const Key *find_key(const Keys *keys, const uint8_t *s, size_t n) {
    uint32_t slot = hash_of(s, n) & (KEY_SLOTS - 1);
    while (keys->slots[slot]) {
        const Key *key = &keys->keys[keys->slots[slot] - 1];
        if (key->length == n && memcmp(key->key, s, n) == 0) return key;
        slot = (slot + 1) & (KEY_SLOTS - 1);
    }
    return NULL;
}

/* Replace ``keys`` with a sequence of (key, kind, low, high), each kind from 0 to ``kinds`` - 1;
 * 0 with a Python exception set (naming ``module``) where it cannot. */
static int configure_keys(Keys *keys, PyObject *sequence, const char *module, int kinds) {
    uint16_t probe = 1;
    if (*(uint8_t *)&probe != 1) { /* the modules read numbers with memcpy */
        PyErr_Format(PyExc_RuntimeError, "%s: a little-endian host is needed", module);
        return 0;
    }
    PyObject *items = PySequence_Fast(sequence, "configure() takes a sequence");
    if (items == NULL) return 0;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(items);
    if (n > MAX_KEYS) {
        Py_DECREF(items);
        PyErr_Format(PyExc_ValueError, "%s: too many keys (%zd, at most %d)", module, n, MAX_KEYS);
        return 0;
    }
    for (Py_ssize_t i = 0; i < keys->count; i++) PyMem_Free(keys->keys[i].key);
    memset(keys->slots, 0, sizeof(keys->slots));
    keys->count = 0;
    keys->configured = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *text;
        Py_ssize_t length;
        int kind;
        long long low, high;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(items, i), "s#iLL", &text, &length, &kind, &low,
                              &high)) {
            Py_DECREF(items);
            return 0;
        }
        if (kind < 0 || kind >= kinds) {
            Py_DECREF(items);
            PyErr_Format(PyExc_ValueError, "%s: a key's kind is from 0 to %d, not %d", module, kinds - 1, kind);
            return 0;
        }
        Key *key = &keys->keys[i];
        key->key = PyMem_Malloc((size_t)length + 1);
        if (key->key == NULL) {
            Py_DECREF(items);
            PyErr_NoMemory();
            return 0;
        }
        memcpy(key->key, text, (size_t)length + 1);
        key->length = (size_t)length;
        key->kind = kind;
        key->low = low;
        key->high = high;
        uint32_t slot = hash_of((const uint8_t *)text, (size_t)length) & (KEY_SLOTS - 1);
        while (keys->slots[slot]) slot = (slot + 1) & (KEY_SLOTS - 1);
        keys->slots[slot] = (int)i + 1;
        keys->count = i + 1;
    }
    Py_DECREF(items);
    keys->configured = 1;
    return 1;
}

#endif
