"""The one exception type for rejected containers, and its stable codes (spec/FORMAT.md §11).

A program acts on `FormatError.code` (one of CODES), never on the message's wording; `field`
names the header field or index path and `offset` the byte offset in the file, where known.
The C reader (runtime/src/container.c) gives the same codes for the same files.
"""

from __future__ import annotations

# code -> the stable substring(s) of the message (FORMAT.md §11 lists the same table).
CODES: dict[str, str] = {
    # header
    "not_regular_file": "not a regular file",
    "truncated": "truncated",
    "unfinished": "unfinished conversion",
    "bad_magic": "bad magic",
    "unsupported_major": "unsupported major version",
    "header_hash_mismatch": "header hash mismatch",
    "header_size": "header_size N != 128",
    "unknown_required_flag": "unknown required flag",
    "reserved_nonzero": "reserved bytes are not zero",
    "bad_alignment": "not a power of two",
    "file_size_mismatch": "!= actual file size",
    "index_length": "index length N outside",
    "index_offset": "must be >= alignment",
    "index_extent": "does not end at file size",
    "header_padding": "header padding",
    # index text
    "index_hash_mismatch": "index hash mismatch",
    "invalid_utf8": "invalid UTF-8",
    "json_depth": "nesting depth",
    "json_syntax": "bad JSON",
    "duplicate_key": "duplicate key",
    "forbidden_constant": "forbidden constant",
    "integer_range": "integer out of range",
    "not_canonical": "not canonical JSON",
    # index structure
    "missing_key": "missing key",
    "wrong_type": "expected a string / an object / an array / an integer",
    "bad_hash_string": "bad hash string",
    "files_unsorted": "not sorted by name or names repeat",
    "too_many_sections": "exceed",
    "bad_name": "printable ASCII",
    "out_of_range": "outside",
    "misaligned": "is not a multiple of",
    "header_region": "lies in the header region",
    "past_index": "runs past the index",
    "bank_hash": "expert banks carry no section hash",
    "duplicate_name": "duplicate section name",
    "empty_class": "empty",
    "bad_shape": "dimensions / elements",
    "unknown_codec": "unknown codec",
    "bad_codec": "the codec's own errors (CODECS.md)",
    "class_codec": "not allowed for class",
    "needs_reconversion": "was made by format 1.0 and must be reconverted",
    "length_mismatch": "for shape × codec",
    "blob_name": "a blob name must be a plain file name",
    "blob_compression": "is not 'none' or 'zstd'",
    "blob_raw_length": "for compression 'none'",
    "hash_table_length": "is not a multiple of 32 / expected count × 32",
    "stride": "is not a multiple of the alignment / != record_length rounded up",
    "bank_length": "!= count C × stride",
    "part_names": "names must be ['gate', 'up', 'down']",
    "part_offset": "parts[J].offset",
    "record_length": "!= end of last part",
    "extent_overlap": "overlaps the previous extent",
    "extent_gap": "gap of N bytes before it / before the index",
    "second_bank": "a second bank for layer",
    "missing_hash_table": "no expert_hashes section named",
    "hash_table_shared": "already used by",
    "orphan_hash_table": "no expert bank refers to this hash table",
    # found after open (reading blobs and payloads; FORMAT.md §4.2, CODECS.md)
    "blob_frame": "zstd (not a zstd frame / zstd frame is N bytes but the blob holds M / ...)",
    "blob_decoded_length": "raw_length says",
    "payload_length": "expected N bytes, got",
    "rvq_reference": "needs the layer's / codebook shape / rotation must be",
    "content_hash": "content hash mismatch / record hash mismatch",
    # the engine's own checks of a well-formed container (FORMAT.md §7, §8)
    "model_description": "manifest.model:",
    "model_tensor": "tensor NAME missing / tensor NAME: shape / elements",
    # any other violation found after open or while planning a container
    "invalid": "any other violation",
}


class FormatError(ValueError):
    """A container (or part of one) violates spec/FORMAT.md.

    code: one of CODES; field: `header.FIELD`, `index`, `index.manifest.KEY…`,
    `index.sections[I] ('NAME').KEY…` or None; offset: byte offset in the file, or None.
    """

    def __init__(self, message: str, code: str = "invalid", field: str | None = None,
                 offset: int | None = None) -> None:
        if code not in CODES:
            raise ValueError(f"FormatError code {code!r} is not in moepack.format.errors.CODES")
        super().__init__(message)
        self.code, self.field, self.offset = code, field, offset

    def with_code(self) -> str:
        """The message, then the code in brackets: the error line of every command (the
        engine's refusals print the same, EngineError.with_code)."""
        return f"{self} [{self.code}]"


def reject(code: str, field: str | None, why: str, offset: int | None = None) -> FormatError:
    """The FormatError `FIELD[ at offset N]: WHY` (just WHY without a field)."""
    if field is None:
        return FormatError(why, code, None, offset)
    at = f" at offset {offset}" if offset is not None else ""
    return FormatError(f"{field}{at}: {why}", code, field, offset)
