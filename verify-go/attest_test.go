package main

// Every case in spec/vectors/attestations.json (spec/docket-attestation-1.md section 7):
// its verdict and code, and an ok run's figures.

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

type attestVector struct {
	Name        string  `json:"name"`
	Run         string  `json:"run"`
	Attestation string  `json:"attestation"`
	Pubkey      string  `json:"pubkey"`
	Verdict     string  `json:"verdict"`
	Code        *string `json:"code"`
	Events      *uint64 `json:"events"`
	Head        *string `json:"head"`
}

func TestAttestationVectors(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(vectorsDir, "attestations.json"))
	if err != nil {
		t.Fatalf("reading the attestation manifest: %v", err)
	}
	var m struct {
		Vectors []attestVector `json:"vectors"`
	}
	if err := json.Unmarshal(data, &m); err != nil || len(m.Vectors) < 6 {
		t.Fatalf("decoding the attestation manifest: %v (%d vectors)", err, len(m.Vectors))
	}
	for _, vec := range m.Vectors {
		vec := vec
		t.Run(vec.Name, func(t *testing.T) {
			at := func(p string) string { return filepath.Join(vectorsDir, p) }
			a, v, ierr := VerifyAttested(at(vec.Run), at(vec.Attestation), at(vec.Pubkey))
			switch vec.Verdict {
			case "input_error":
				if ierr == nil || ierr.Code != *vec.Code {
					t.Fatalf("want input error %s, got %+v %+v", *vec.Code, ierr, v)
				}
			case "ok":
				if ierr != nil || !v.OK || a == nil {
					t.Fatalf("want ok, got %+v %+v", ierr, v)
				}
				if vec.Events != nil && (a.Receipt == nil || a.Receipt.Events != *vec.Events || a.Receipt.Head != *vec.Head) {
					t.Fatalf("figures %+v, want %d %s", a.Receipt, *vec.Events, *vec.Head)
				}
			default:
				if ierr != nil || v == nil || v.OK || v.Code != *vec.Code {
					t.Fatalf("want %s, got %+v %+v", *vec.Code, ierr, v)
				}
			}
		})
	}
}
