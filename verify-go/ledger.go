package main

// The chain (spec sections 3 and 4): lines read as raw bytes, each hashed
// exactly as read, with its offset. bufio.Scanner is not used: its token
// limit (64 KiB by default) would refuse long lines a ledger may hold, and
// the spec's own bound (64 MiB) is enforced here instead.

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
)

const MaxLineBytes = 64 << 20

// skeletonAbove: lines longer than this are read as skeletons (json.go):
// every byte checked, only the members the tally reads ever built.
var skeletonAbove = 1 << 20

const chunkBytes = 1 << 20

var Genesis = "0000000000000000000000000000000000000000000000000000000000000000"
var LedgerMagic = []byte(`{"v":`)

// ChainError is the first line that breaks the chain (or the torn tail).
type ChainError struct {
	Code   string
	Seq    uint64
	Offset uint64
	Detail string
}

// Scan is what one pass over a ledger found.
type Scan struct {
	Events     uint64
	Head       string
	Size       uint64 // bytes of accepted lines
	LastOffset int64  // where the last accepted line starts; -1 if none
	MarkOffset int64  // where line number `mark` starts; -1 if the file has no such line
	Chain      *ChainError
	Event      *ChainError // the first event the tally could not read
	Tally      *Tally
	Stopped    bool // stopAt lines were read and the file goes on
}

func isHex64(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < 64; i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// checkLine applies section 4's checks 1 to 6 to one line and returns its event.
func (s *Scan) checkLine(d *Decoder, line []byte, lastMono *uint64) (*Value, *ChainError) {
	at := func(code, format string, args ...interface{}) *ChainError {
		return &ChainError{Code: code, Seq: s.Events, Offset: s.Size, Detail: fmt.Sprintf(format, args...)}
	}
	d.p.skeleton = len(line) > skeletonAbove
	event, perr := d.Decode(line)
	if perr != nil {
		return nil, at("malformed_line", "not strict JSON: %s", perr.Msg)
	}
	if event.Kind != Object {
		return nil, at("malformed_line", "not a JSON object")
	}
	for _, name := range [...]string{"v", "seq", "ts", "mono_ms", "type", "prev"} {
		if !event.Has(name) {
			return nil, at("malformed_line", "no %q member", name)
		}
	}
	v, vok := event.Get("v").Count()
	if !vok && !(event.Get("v").Kind == Number && event.Get("v").Int && event.Get("v").Str[0] != '-') {
		return nil, at("malformed_line", "v must be an integer >= 0")
	}
	seq, ok := event.Get("seq").Count()
	if !ok {
		return nil, at("malformed_line", "seq must be an integer from 0 to 2^53-1")
	}
	mono, ok := event.Get("mono_ms").Count()
	if !ok {
		return nil, at("malformed_line", "mono_ms must be an integer from 0 to 2^53-1")
	}
	if event.Get("ts").Kind != String {
		return nil, at("malformed_line", "ts must be a string")
	}
	if t := event.Get("type"); t.Kind != String || t.Str == "" {
		return nil, at("malformed_line", "type must be a non-empty string")
	}
	prev := event.Get("prev")
	if prev.Kind != String || !isHex64(prev.Str) {
		return nil, at("malformed_line", "prev must be 64 lowercase hex digits")
	}
	if !vok || v != 1 {
		return nil, at("unsupported_version", "v is %s; this verifier reads version 1", event.Get("v").Str)
	}
	if seq != s.Events {
		return nil, at("seq_gap", "seq is %d where %d was due", seq, s.Events)
	}
	if prev.Str != s.Head {
		return nil, at("chain_break", "prev is %s, the line before hashes to %s", prev.Str, s.Head)
	}
	if mono < *lastMono {
		return nil, at("mono_regression", "mono_ms %d is below the line before's %d", mono, *lastMono)
	}
	*lastMono = mono
	return event, nil
}

// ScanLedger checks the chain over the file, folding each accepted event
// into a tally. mark: note where that line starts. stopAt >= 0: read only
// that many lines (a receipt that discloses an unverified tail vouches for
// no more). Returns an error only when the file cannot be read.
func ScanLedger(path string, mark uint64, stopAt int64) (*Scan, error) {
	s := &Scan{Head: Genesis, LastOffset: -1, MarkOffset: -1, Tally: NewTally()}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var lastMono uint64
	var decoder Decoder
	var carry []byte // the line being read, when it spans chunks
	buf := make([]byte, chunkBytes)
	lineStart := uint64(0) // file offset of carry's first byte
	// feed handles one complete line; false stops the pass.
	feed := func(line []byte) bool {
		if stopAt >= 0 && s.Events == uint64(stopAt) {
			s.Stopped = true
			return false
		}
		if s.Events == mark {
			s.MarkOffset = int64(s.Size)
		}
		if len(line) > MaxLineBytes {
			s.Chain = &ChainError{"malformed_line", s.Events, s.Size,
				fmt.Sprintf("a line at byte %d is longer than %d bytes", s.Size, MaxLineBytes)}
			return false
		}
		offset := s.Size
		event, cerr := s.checkLine(&decoder, line, &lastMono)
		if cerr != nil {
			s.Chain = cerr
			return false
		}
		if s.Event == nil {
			if msg := s.Tally.Add(event); msg != "" {
				s.Event = &ChainError{"malformed_event", s.Events, offset, msg}
			}
		}
		sum := sha256.Sum256(line)
		s.Head = hex.EncodeToString(sum[:])
		s.LastOffset = int64(offset)
		s.Events++
		s.Size += uint64(len(line)) + 1
		return true
	}
	for {
		n, rerr := f.Read(buf)
		block := buf[:n]
		for len(block) > 0 {
			i := bytes.IndexByte(block, '\n')
			if i < 0 {
				if len(carry)+len(block) > MaxLineBytes {
					// Longer than any line may be: not read (so memory stays bounded).
					if stopAt >= 0 && s.Events == uint64(stopAt) {
						s.Stopped = true
						return s, nil
					}
					if s.Events == mark {
						s.MarkOffset = int64(s.Size)
					}
					s.Chain = &ChainError{"malformed_line", s.Events, lineStart,
						fmt.Sprintf("a line at byte %d is longer than %d bytes", lineStart, MaxLineBytes)}
					return s, nil
				}
				carry = append(carry, block...)
				break
			}
			var line []byte
			if len(carry) > 0 {
				carry = append(carry, block[:i]...)
				line = carry
			} else {
				line = block[:i]
			}
			if !feed(line) {
				return s, nil
			}
			carry = carry[:0]
			block = block[i+1:]
			lineStart = s.Size
		}
		if rerr == io.EOF || (n == 0 && rerr == nil) {
			break
		}
		if rerr != nil {
			return nil, rerr
		}
	}
	if len(carry) > 0 && !(stopAt >= 0 && s.Events == uint64(stopAt)) {
		s.Chain = &ChainError{"torn_tail", s.Events, s.Size,
			fmt.Sprintf("the last %d bytes are a line with no newline", len(carry))}
	} else if len(carry) > 0 {
		s.Stopped = true
	}
	return s, nil
}
