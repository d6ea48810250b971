"""Unpacking gzip data the user can replace (a store's committed rows, a haystack snapshot) without trusting its
size: ``gzip.decompress`` unpacks whatever the data says, so 42 MB that unpack to 9 GB (a gzip bomb, or a file
swapped in by mistake) ended a run in ``MemoryError`` — or drew the machine's out-of-memory killer onto another
process (probe 9). :func:`gunzip` stops at a bound and says so."""

import zlib

CHUNK = 1 << 20
"""Bytes unpacked at a time, so that the bound is checked before memory is spent past it."""


class GunzipLimitError(OSError):
    """Gzip data that unpacks past its bound: an ``OSError``, as ``gzip`` names data it cannot unpack, so that each
    reader's clause for a damaged file turns it into its usual one line."""


def gunzip(raw: bytes, limit: int) -> bytes:
    """``raw`` (one or more gzip members, as ``gzip.decompress`` reads) unpacked; ``GunzipLimitError`` once the
    output passes ``limit`` bytes, ``OSError``/``EOFError`` for data that is no gzip or is cut short, as
    ``gzip.decompress`` raises them."""
    out, rest = bytearray(), raw
    while rest:  # no bytes at all unpack to none, as gzip.decompress has it
        unpacker = zlib.decompressobj(wbits=31)  # 31: a gzip header and trailer
        data = rest
        try:
            # at a member's end zlib keeps what follows in unused_data (and, where the output limit was reached
            # there, in unconsumed_tail too): the next member's, never this one's. Output may still be pending
            # once every byte is read, so the loop ends at the member's end or where nothing moves any more
            while not unpacker.eof:
                chunk = unpacker.decompress(data, CHUNK)
                out += chunk
                if len(out) > limit:
                    raise GunzipLimitError(f"unpacks to more than {limit // 2**20:,} MiB")
                if not chunk and len(unpacker.unconsumed_tail) == len(data):
                    break  # the data ended inside the member: cut short
                data = unpacker.unconsumed_tail
        except zlib.error as error:
            raise OSError(f"not a gzip file or damaged: {error}") from None
        if not unpacker.eof:
            raise EOFError("compressed data ended before the end-of-stream marker was reached")
        rest = unpacker.unused_data.lstrip(b"\0")  # members may follow, zero padding between them
    return bytes(out)
