// Package inet holds Internet checksum helpers for the test guest and the
// NAPI probe.
package inet

import "encoding/binary"

// Checksum is the Internet checksum (RFC 1071) of b, starting from sum: the
// one's complement of the folded one's complement sum of b's 16-bit words,
// an odd last byte padded with zero. Over data that carries a correct
// checksum it is 0.
func Checksum(b []byte, sum uint32) uint16 {
	for ; len(b) >= 2; b = b[2:] {
		sum += uint32(binary.BigEndian.Uint16(b))
	}
	if len(b) == 1 {
		sum += uint32(b[0]) << 8
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

// PseudoHeaderSum is the unfolded one's complement sum of the IPv4 pseudo
// header (RFC 768, RFC 793) of a UDP or TCP segment of l4Len bytes from src
// to dst (4 bytes each), to pass to Checksum as its starting sum.
func PseudoHeaderSum(src, dst []byte, proto uint8, l4Len int) uint32 {
	var s uint32
	for i := 0; i < 4; i += 2 {
		s += uint32(binary.BigEndian.Uint16(src[i:])) + uint32(binary.BigEndian.Uint16(dst[i:]))
	}
	return s + uint32(proto) + uint32(l4Len)
}
