"""Whether a parquet file carries page checksums (CRC32), read from its first page header.

pyarrow verifies a page's checksum where the page has one and passes a page without one: a file
of an older writer can hold a flipped bit that no read notices. Parquet writes each page header
in Thrift's compact protocol, fields in order; the first three are i32s (the page type and its two
sizes), and the checksum, when written, is the fourth. So the byte after the third field says.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

__all__ = ["has_page_checksums"]

#: A compact-protocol field header for the next field id (+1) holding an i32.
_NEXT_I32 = 0x15
_HEADER_BYTES = 64


def has_page_checksums(parquet: pq.ParquetFile, path: Path) -> bool:
    """True when the file's first page has a checksum (xsp writes every page alike), or when its
    header is not one this reading knows (never a false alarm)."""
    meta = parquet.metadata
    if meta.num_row_groups == 0 or meta.num_columns == 0:
        return True
    chunk = meta.row_group(0).column(0)
    offset = chunk.dictionary_page_offset if chunk.has_dictionary_page else None
    offset = offset if offset else chunk.data_page_offset
    with open(path, "rb") as handle:
        handle.seek(offset)
        header = handle.read(_HEADER_BYTES)
    at = 0
    for _ in range(3):  # type, uncompressed size, compressed size
        if at >= len(header) or header[at] != _NEXT_I32:
            return True
        at += 1
        while at < len(header) and header[at] & 0x80:  # a varint's continuation bytes
            at += 1
        at += 1
    return at < len(header) and header[at] == _NEXT_I32
