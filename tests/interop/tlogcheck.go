// tlogcheck checks casetrail's transparency-log formats with Go's reference code,
// golang.org/x/mod/sumdb/tlog (RFC 6962 trees, proofs, tiles) and
// golang.org/x/mod/sumdb/note (signed notes). It reads a JSON request on stdin and
// writes what Go computed and concluded as JSON on stdout; tests/unit/test_ledger_formats.py
// compares.
package main

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

type inclusion struct {
	Index int64    `json:"index"`
	Size  int64    `json:"size"`
	Proof []string `json:"proof"`
}

type consistency struct {
	Old   int64    `json:"old"`
	New   int64    `json:"new"`
	Proof []string `json:"proof"`
}

type request struct {
	Leaves        []string      `json:"leaves"`
	Sizes         []int64       `json:"sizes"`
	Inclusions    []inclusion   `json:"inclusions"`
	Consistencies []consistency `json:"consistencies"`
	Note          string        `json:"note"`
	VerifierKey   string        `json:"verifierKey"`
	SignerKey     string        `json:"signerKey"`
	Text          string        `json:"text"`
	Tiles         []int64       `json:"tileSizes"`
}

type reply struct {
	Roots            map[string]string `json:"roots"`
	InclusionOK      []bool            `json:"inclusionOk"`
	InclusionGo      [][]string        `json:"inclusionGo"`
	ConsistencyOK    []bool            `json:"consistencyOk"`
	NoteOK           bool              `json:"noteOk"`
	NoteError        string            `json:"noteError"`
	NoteText         string            `json:"noteText"`
	SignedByGo       string            `json:"signedByGo"`
	Tiles            map[string]string `json:"tiles"`
}

func decode(items []string) []tlog.Hash {
	out := make([]tlog.Hash, len(items))
	for i, item := range items {
		raw, err := base64.StdEncoding.DecodeString(item)
		if err != nil || len(raw) != 32 {
			panic(fmt.Sprintf("bad hash %q", item))
		}
		copy(out[i][:], raw)
	}
	return out
}

func b64(h tlog.Hash) string { return base64.StdEncoding.EncodeToString(h[:]) }

func main() {
	var req request
	if err := json.NewDecoder(os.Stdin).Decode(&req); err != nil {
		panic(err)
	}
	var stored []tlog.Hash
	reader := tlog.HashReaderFunc(func(indexes []int64) ([]tlog.Hash, error) {
		out := make([]tlog.Hash, len(indexes))
		for i, index := range indexes {
			out[i] = stored[index]
		}
		return out, nil
	})
	for i, leaf := range req.Leaves {
		data, err := base64.StdEncoding.DecodeString(leaf)
		if err != nil {
			panic(err)
		}
		hashes, err := tlog.StoredHashes(int64(i), data, reader)
		if err != nil {
			panic(err)
		}
		stored = append(stored, hashes...)
	}
	rep := reply{Roots: map[string]string{}, Tiles: map[string]string{}}
	root := func(n int64) tlog.Hash {
		h, err := tlog.TreeHash(n, reader)
		if err != nil {
			panic(err)
		}
		return h
	}
	for _, n := range req.Sizes {
		rep.Roots[fmt.Sprint(n)] = b64(root(n))
	}
	for _, p := range req.Inclusions {
		data, _ := base64.StdEncoding.DecodeString(req.Leaves[p.Index])
		err := tlog.CheckRecord(decode(p.Proof), p.Size, root(p.Size), p.Index, tlog.RecordHash(data))
		rep.InclusionOK = append(rep.InclusionOK, err == nil)
		own, err := tlog.ProveRecord(p.Size, p.Index, reader)
		if err != nil {
			panic(err)
		}
		path := []string{}
		for _, h := range own {
			path = append(path, b64(h))
		}
		rep.InclusionGo = append(rep.InclusionGo, path)
	}
	for _, p := range req.Consistencies {
		err := tlog.CheckTree(decode(p.Proof), p.New, root(p.New), p.Old, root(p.Old))
		rep.ConsistencyOK = append(rep.ConsistencyOK, err == nil)
	}
	// Tiles of height 8, as c2sp.org/tlog-tiles stores them, for each size asked.
	for _, n := range req.Tiles {
		for _, tile := range tlog.NewTiles(8, 0, n) {
			data, err := tlog.ReadTileData(tile, reader)
			if err != nil {
				panic(err)
			}
			rep.Tiles[fmt.Sprintf("%d/%d/%d", n, tile.L, tile.N)] = base64.StdEncoding.EncodeToString(data)
		}
	}
	verifier, err := note.NewVerifier(req.VerifierKey)
	if err != nil {
		panic(err)
	}
	opened, err := note.Open([]byte(req.Note), note.VerifierList(verifier))
	rep.NoteOK = err == nil
	if err != nil {
		rep.NoteError = err.Error()
	} else {
		rep.NoteText = opened.Text
	}
	signer, err := note.NewSigner(req.SignerKey)
	if err != nil {
		panic(err)
	}
	signed, err := note.Sign(&note.Note{Text: req.Text}, signer)
	if err != nil {
		panic(err)
	}
	rep.SignedByGo = string(signed)
	if err := json.NewEncoder(os.Stdout).Encode(rep); err != nil {
		panic(err)
	}
}
