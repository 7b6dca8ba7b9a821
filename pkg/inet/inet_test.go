package inet

import (
	"encoding/hex"
	"testing"
)

func mustHex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestChecksum(t *testing.T) {
	tests := []struct {
		name string
		data string // hex
		sum  uint32
		want uint16
	}{
		// RFC 1071 section 3: these bytes sum to 0xddf2.
		{name: "RFC 1071 example", data: "0001f203f4f5f6f7", want: ^uint16(0xddf2)},
		// A real IPv4 header (192.168.0.1 -> 192.168.0.199, UDP) with its
		// checksum field zeroed yields the checksum it carries, 0xb861 ...
		{name: "IPv4 header, checksum zeroed", data: "450000730000400040110000c0a80001c0a800c7", want: 0xb861},
		// ... and with the checksum in place it checks: 0.
		{name: "IPv4 header, checksum in place", data: "45000073000040004011b861c0a80001c0a800c7", want: 0},
		{name: "odd length pads with zero", data: "01", want: 0xfeff},
		{name: "empty", data: "", want: 0xffff},
		{name: "starting sum carries fold", data: "", sum: 0x1ffff, want: 0xfffe},
		{name: "starting sum adds to data", data: "0001", sum: 0x0002, want: 0xfffc},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Checksum(mustHex(t, tt.data), tt.sum); got != tt.want {
				t.Errorf("Checksum(%s, %#x) = %#04x, want %#04x", tt.data, tt.sum, got, tt.want)
			}
		})
	}
}

func TestPseudoHeaderSum(t *testing.T) {
	tests := []struct {
		name     string
		src, dst []byte
		proto    uint8
		l4Len    int
		want     uint32
	}{
		{
			// c0a8+0001+c0a8+00c7+0011+005f, unfolded.
			name: "UDP 192.168.0.1 -> 192.168.0.199",
			src:  []byte{192, 168, 0, 1}, dst: []byte{192, 168, 0, 199},
			proto: 17, l4Len: 0x5f, want: 0x18288,
		},
		{
			// c000+0201+c000+0202+0006+03fc.
			name: "TCP 192.0.2.1 -> 192.0.2.2",
			src:  []byte{192, 0, 2, 1}, dst: []byte{192, 0, 2, 2},
			proto: 6, l4Len: 1020, want: 0x18805,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := PseudoHeaderSum(tt.src, tt.dst, tt.proto, tt.l4Len); got != tt.want {
				t.Errorf("PseudoHeaderSum = %#x, want %#x", got, tt.want)
			}
		})
	}
}

// A UDP datagram whose checksum was computed over the pseudo header checks
// to 0 over the same pseudo header.
func TestChecksumOverPseudoHeaderRoundTrips(t *testing.T) {
	src, dst := []byte{10, 99, 0, 2}, []byte{10, 99, 0, 1}
	udp := mustHex(t, "270f9c40000f00006e617069746170") // ports 9999->40000, len 15, "napitap"
	ph := PseudoHeaderSum(src, dst, 17, len(udp))
	c := Checksum(udp, ph)
	udp[6], udp[7] = byte(c>>8), byte(c)
	if got := Checksum(udp, ph); got != 0 {
		t.Errorf("datagram with checksum %#04x does not check: residue %#04x", c, got)
	}
}
