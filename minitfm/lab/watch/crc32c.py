"""CRC-32C, the checksum of every record of a TensorBoard event file, in numpy.

Without TensorFlow, TensorBoard's writer checksums each record in pure Python, a byte at a
time, on a thread of the training process (what that cost: docs/speed.md).
`use_in_tensorboard` has it use `masked_crc32c` below: the same numbers, from numpy.

The CRC (Castagnoli polynomial, reflected, as iSCSI and TFRecord use it) of a long record is
taken in lanes: the record is cut into blocks of BLOCK bytes, numpy runs the byte-at-a-time
rule on all the blocks at once (BLOCK steps, each over every block), and the blocks' CRCs are
joined pairwise.
The rule is linear over GF(2): the register after a block is (the register before it, carried
over the block's length of zero bytes) XOR (the block's own CRC from a zero register), and
carrying a register over m zero bytes is a 32 x 32 bit matrix (`Carry`).
"""

from __future__ import annotations

import numpy as np

POLY = 0x82F63B78  # the Castagnoli polynomial, bit-reversed
MASK = 0xFFFFFFFF
BLOCK = 16  # bytes of a lane: a long record is cut into lanes of BLOCK bytes
SHORT = 2048  # bytes: a shorter record goes a byte at a time (numpy's start-up costs more)


def _table() -> np.ndarray:
    """The register's step for each low byte (256,) uint32: eight shifts of the polynomial."""
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ np.uint32(POLY), table >> 1).astype(np.uint32)
    return table


TABLE = _table()
TABLE_LIST = TABLE.tolist()  # Python ints: the byte-at-a-time rule in plain Python


def crc32c(data: bytes) -> int:
    """The CRC-32C of `data` (register starts at 0xFFFFFFFF, ends XORed with it)."""
    if len(data) < SHORT:
        crc = MASK
        for byte in data:
            crc = TABLE_LIST[(crc ^ byte) & 0xFF] ^ (crc >> 8)
        return crc ^ MASK
    raw = np.frombuffer(data, dtype=np.uint8).copy()
    raw[:4] ^= 0xFF  # a register starting at 0xFFFFFFFF is the first 4 bytes inverted
    return int(lanes_crc(raw)) ^ MASK


def lanes_crc(data: np.ndarray) -> np.uint32:
    """The register after `data` (uint8) from a zero register, in lanes of BLOCK bytes."""
    lanes = 1 << ((len(data) - 1) // BLOCK).bit_length()  # a power of two: joined in pairs
    blocks = np.zeros(lanes * BLOCK, dtype=np.uint8)
    blocks[len(blocks) - len(data):] = data  # zero bytes in front leave a zero register at 0
    crc = np.zeros(lanes, dtype=np.uint32)
    for column in blocks.reshape(lanes, BLOCK).T:  # step j of every block at once
        crc = TABLE[(crc ^ column) & 0xFF] ^ (crc >> 8)
    for carry in CARRIES[:lanes.bit_length() - 1]:  # join neighbours: (the first carried
        crc = carry(crc[0::2]) ^ crc[1::2]  # over the second's length) ^ the second
    return crc[0]


class Carry:
    """Carrying a register over m zero bytes, a linear map: its 32 columns (the images of the
    registers 1 << i)."""

    BITS = np.arange(32, dtype=np.uint32)

    def __init__(self, columns: np.ndarray):
        self.columns = columns  # (32,) uint32

    @classmethod
    def over(cls, m: int) -> Carry:
        """Over m zero bytes, by the byte-at-a-time rule on the 32 unit registers."""
        crc = np.uint32(1) << cls.BITS
        for _ in range(m):
            crc = TABLE[crc & 0xFF] ^ (crc >> 8)
        return cls(crc)

    def __call__(self, registers: np.ndarray) -> np.ndarray:
        """The registers (n,) uint32 carried: the XOR of the columns of their set bits."""
        bits = (registers[:, None] >> self.BITS) & 1  # (n, 32)
        return np.bitwise_xor.reduce(bits * self.columns, axis=1).astype(np.uint32)

    def twice(self) -> Carry:
        """Over twice as many zero bytes: this map after itself."""
        return Carry(self(self.columns))


def _carries(levels: int) -> tuple[Carry, ...]:
    """Carry over BLOCK * 2**j zero bytes, for j < levels: what joins a pair at level j."""
    carries = [Carry.over(BLOCK)]
    while len(carries) < levels:
        carries.append(carries[-1].twice())
    return tuple(carries)


CARRIES = _carries(32)  # records up to BLOCK * 2**32 bytes: more than a protobuf can hold


def masked_crc32c(data: bytes) -> int:
    """The CRC as a TFRecord stores it: rotated right by 15 bits, plus a constant."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & MASK


def use_in_tensorboard() -> None:
    """Have TensorBoard's event writer checksum its records with `masked_crc32c` (it looks the
    function up in its module at each record; the numbers are the same)."""
    from tensorboard.summary.writer import record_writer

    record_writer.masked_crc32c = masked_crc32c
