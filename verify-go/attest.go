package main

// Attestations (spec/docket-attestation-1.md): a DSSE envelope holding an in-toto
// Statement v1 over a run's files, signed with Ed25519. The checks, in order (its
// section 5): the envelope (at most 1 MiB, strict JSON, shaped), a signature present,
// one that verifies over PAE with the given key, the payloadType, the statement, each
// subject's sha256 against the file, then for a run the receipt and the predicate's
// ledger figures against what the receipt's check re-derived.

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

const (
	MaxEnvelopeBytes = 1 << 20
	PayloadType      = "application/vnd.in-toto+json"
	StatementType    = "https://in-toto.io/Statement/v1"
	RunPredicate     = "https://docket.dev/attestation/run/v1"
	GamedayPredicate = "https://docket.dev/attestation/gameday/v1"
)

var subjectFiles = map[string][]string{
	RunPredicate:     {"ledger.jsonl", "receipt.json"},
	GamedayPredicate: {"gameday.json", "junit.xml"},
}

var b64Text = regexp.MustCompile(`^[A-Za-z0-9+/]*={0,2}$`)
var hex64 = regexp.MustCompile(`^[0-9a-f]{64}$`)

// Attested: the envelope's findings, and for a run the receipt's verdict.
type Attested struct {
	Kind     string
	KeyID    string
	Subjects []string
	Receipt  *Verdict // nil for a game-day report
}

func pae(payloadType string, body []byte) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "DSSEv1 %d %s %d ", len(payloadType), payloadType, len(body))
	b.Write(body)
	return b.Bytes()
}

// b64Canonical: standard or URL-safe base64, padded, that encodes back to itself.
func b64Canonical(text string) ([]byte, bool) {
	std := strings.NewReplacer("-", "+", "_", "/").Replace(text)
	if len(std)%4 != 0 || !b64Text.MatchString(std) {
		return nil, false
	}
	data, err := base64.StdEncoding.DecodeString(std)
	if err != nil || base64.StdEncoding.EncodeToString(data) != std {
		return nil, false
	}
	return data, true
}

func readBounded(path, what, code string, max int64) ([]byte, *InputError) {
	f, err := os.Open(path)
	if err != nil {
		return nil, &InputError{code, what + " " + path + ": cannot read (" + errText(err) + ")"}
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() {
		return nil, &InputError{code, what + " " + path + ": not a regular file"}
	}
	data, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, &InputError{code, what + " " + path + ": cannot read (" + errText(err) + ")"}
	}
	return data, nil
}

func loadPublicKey(path string) (ed25519.PublicKey, *InputError) {
	data, ierr := readBounded(path, "public key", "pubkey_unreadable", 16<<10)
	if ierr != nil {
		return nil, ierr
	}
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "PUBLIC KEY" {
		return nil, &InputError{"pubkey_unreadable", "public key " + path + ": not a PEM public key"}
	}
	key, err := x509.ParsePKIXPublicKey(block.Bytes)
	if err != nil {
		return nil, &InputError{"pubkey_unreadable", "public key " + path + ": " + err.Error()}
	}
	pub, ok := key.(ed25519.PublicKey)
	if !ok {
		return nil, &InputError{"pubkey_unreadable", fmt.Sprintf("public key %s: a %T, not Ed25519", path, key)}
	}
	return pub, nil
}

func statementProblem(st *Value) string {
	if st.Kind != Object {
		return "the payload is not a JSON object"
	}
	if t := st.Get("_type"); t == nil || t.Kind != String || t.Str != StatementType {
		return "_type is not " + StatementType
	}
	pt := st.Get("predicateType")
	var kind string
	if pt != nil && pt.Kind == String {
		kind = pt.Str
	}
	want, known := subjectFiles[kind]
	if !known {
		return "predicateType is not one of " + RunPredicate + ", " + GamedayPredicate
	}
	subject := st.Get("subject")
	if subject == nil || subject.Kind != Array {
		return "subject is not an array"
	}
	var names []string
	for i, s := range subject.Items {
		name, digest := s.Get("name"), s.Get("digest")
		if name == nil || name.Kind != String || digest == nil || digest.Kind != Object {
			return fmt.Sprintf("subject[%d] has no name and digest", i)
		}
		if d := digest.Get("sha256"); d == nil || d.Kind != String || !hex64.MatchString(d.Str) {
			return fmt.Sprintf("subject[%d].digest.sha256 is not 64 lowercase hex digits", i)
		}
		names = append(names, name.Str)
	}
	sorted := append([]string(nil), want...)
	sort.Strings(sorted)
	sort.Strings(names)
	if strings.Join(names, "\x00") != strings.Join(sorted, "\x00") || len(names) != len(sorted) {
		return "the subjects are not " + strings.Join(want, " and ") + ", each once"
	}
	p := st.Get("predicate")
	if p == nil || p.Kind != Object {
		return "predicate is not an object"
	}
	if kind == RunPredicate {
		l := p.Get("ledger")
		if r := p.Get("run_id"); r == nil || r.Kind != String || l == nil || l.Kind != Object {
			return "predicate has no run_id and ledger"
		}
		_, okE := l.Get("events").Count()
		_, okB := l.Get("bytes").Count()
		h := l.Get("head")
		if !okE || !okB || h == nil || h.Kind != String {
			return "predicate.ledger has no events, head and bytes (integers 0 to 2^53 - 1)"
		}
	}
	return ""
}

func sha256File(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		return "", fmt.Errorf("not a regular file")
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// VerifyAttested: the envelope's checks, then for a run the receipt's.
func VerifyAttested(run, envelopePath, pubkeyPath string) (*Attested, *Verdict, *InputError) {
	pub, ierr := loadPublicKey(pubkeyPath)
	if ierr != nil {
		return nil, nil, ierr
	}
	folder := run
	if st, err := os.Stat(run); err != nil || !st.IsDir() {
		folder = filepath.Dir(run)
	}
	data, ierr := readBounded(envelopePath, "attestation", "attestation_unreadable", MaxEnvelopeBytes)
	if ierr != nil {
		return nil, nil, ierr
	}
	if len(data) > MaxEnvelopeBytes {
		return nil, nil, &InputError{"attestation_too_large", fmt.Sprintf("attestation %s: more than %d bytes (not read further)", envelopePath, MaxEnvelopeBytes)}
	}
	env, perr := Decode(data)
	if perr != nil {
		return nil, nil, &InputError{"attestation_not_json", "attestation " + envelopePath + ": not JSON (" + perr.Msg + ")"}
	}
	bad := func(msg string) (*Attested, *Verdict, *InputError) {
		return nil, failed("envelope_malformed", "", msg), nil
	}
	if env.Kind != Object {
		return bad("the envelope is not a JSON object")
	}
	pt, payload := env.Get("payloadType"), env.Get("payload")
	if pt == nil || pt.Kind != String {
		return bad("payloadType is not a string")
	}
	if payload == nil || payload.Kind != String {
		return bad("payload is not a string")
	}
	body, ok := b64Canonical(payload.Str)
	if !ok {
		return bad("payload is not canonical base64")
	}
	var sigs [][]byte
	if s := env.Get("signatures"); !s.IsNull() {
		if s.Kind != Array {
			return bad("signatures is not an array")
		}
		for i, item := range s.Items {
			sig := item.Get("sig")
			if sig == nil || sig.Kind != String {
				return bad(fmt.Sprintf("signatures[%d] has no sig string", i))
			}
			raw, ok := b64Canonical(sig.Str)
			if !ok {
				return bad(fmt.Sprintf("signatures[%d].sig is not canonical base64", i))
			}
			sigs = append(sigs, raw)
		}
	}
	if len(sigs) == 0 {
		return nil, failed("signature_missing", "", "the envelope carries no signature"), nil
	}
	sum := sha256.Sum256(pub)
	keyID := hex.EncodeToString(sum[:])
	message := pae(pt.Str, body)
	verified := false
	for _, sig := range sigs {
		if len(sig) == ed25519.SignatureSize && ed25519.Verify(pub, message, sig) {
			verified = true
			break
		}
	}
	if !verified {
		return nil, failed("signature_invalid", "", "no signature verifies over the envelope with key "+keyID), nil
	}
	if pt.Str != PayloadType {
		return nil, failed("payload_type_mismatch", "", "payloadType is "+strconv.Quote(pt.Str)+", not "+PayloadType), nil
	}
	st, perr := Decode(body)
	if perr != nil {
		return nil, failed("statement_malformed", "", "the payload is not JSON ("+perr.Msg+")"), nil
	}
	if problem := statementProblem(st); problem != "" {
		return nil, failed("statement_malformed", "", problem), nil
	}
	a := &Attested{Kind: st.Get("predicateType").Str, KeyID: keyID}
	for _, s := range st.Get("subject").Items {
		name, want := s.Get("name").Str, s.Get("digest").Get("sha256").Str
		have, err := sha256File(filepath.Join(folder, name))
		if err != nil {
			return nil, failed("subject_missing", "", "subject "+name+": no such file in "+folder), nil
		}
		if have != want {
			return nil, failed("subject_mismatch", "", "subject "+name+": sha256 "+have+" on disk, "+want+" signed"), nil
		}
		a.Subjects = append(a.Subjects, name)
	}
	if a.Kind != RunPredicate {
		return a, &Verdict{OK: true}, nil
	}
	names := subjectFiles[RunPredicate]
	v, ierr := Verify(filepath.Join(folder, names[1]), filepath.Join(folder, names[0]))
	if ierr != nil || !v.OK {
		return nil, v, ierr
	}
	a.Receipt = v
	claimed := st.Get("predicate").Get("ledger")
	events, _ := claimed.Get("events").Count()
	size, _ := claimed.Get("bytes").Count()
	head := claimed.Get("head").Str
	switch {
	case events != v.Events:
		return nil, failed("predicate_mismatch", "", fmt.Sprintf("predicate.ledger.events is %d, the ledger's is %d", events, v.Events)), nil
	case head != v.Head:
		return nil, failed("predicate_mismatch", "", fmt.Sprintf("predicate.ledger.head is %q, the ledger's is %q", head, v.Head)), nil
	case size != v.Bytes:
		return nil, failed("predicate_mismatch", "", fmt.Sprintf("predicate.ledger.bytes is %d, the ledger's is %d", size, v.Bytes)), nil
	}
	return a, v, nil
}

func attestedLine(a *Attested) string {
	what := "game-day report"
	if a.Receipt != nil {
		what = "run"
	}
	line := fmt.Sprintf("attested %s (key %s; %s match)", what, a.KeyID, strings.Join(a.Subjects, ", "))
	if a.Receipt != nil {
		line += "; " + summary(a.Receipt)
	}
	return line
}
