package bench

import (
	"net/http"
	"strconv"
	"testing"
)

// TestSingleSubjectsTakeTheirPath checks that every configuration does what
// its scenario claims: an allowed limiter admits every check, a denied one
// admits the first and refuses the rest.
func TestSingleSubjectsTakeTheirPath(t *testing.T) {
	const n = 20_000
	for _, subj := range SingleSubjects() {
		for _, sc := range []Scenario{Allowed, Denied} {
			check, done := subj.New(sc)
			if check == nil {
				done()
				continue
			}
			admitted := 0
			for range n {
				if check() {
					admitted++
				}
			}
			done()
			want := n
			if sc == Denied && !subj.Floor {
				want = 1
			}
			if admitted != want {
				t.Errorf("%s, scenario %d: %d of %d admitted, want %d", subj.Name, sc, admitted, n, want)
			}
		}
	}
}

// TestKeyedSubjectsAdmit checks that every keyed subject admits the first
// and the second check of each of many keys.
func TestKeyedSubjectsAdmit(t *testing.T) {
	keys := make([]string, 10_000)
	for i := range keys {
		keys[i] = "key-" + strconv.Itoa(i)
	}
	for _, subj := range KeyedSubjects() {
		check, done := subj.New()
		admitted := 0
		for range 2 {
			for _, k := range keys {
				if check(k) {
					admitted++
				}
			}
		}
		done()
		if admitted != 2*len(keys) {
			t.Errorf("%s: %d of %d admitted", subj.Name, admitted, 2*len(keys))
		}
	}
}

func TestKeys(t *testing.T) {
	keys, order := Keys()
	if len(keys) != NumKeys || len(order) != NumKeys {
		t.Fatalf("%d keys, %d in order", len(keys), len(order))
	}
	seen := make(map[string]bool, NumKeys)
	for _, k := range keys {
		if seen[k] {
			t.Fatalf("duplicate key %q", k)
		}
		seen[k] = true
	}
	hit := make([]bool, NumKeys)
	for _, i := range order {
		if hit[i] {
			t.Fatalf("index %d twice in the order", i)
		}
		hit[i] = true
	}
}

// TestHTTPSubjectsTakeTheirPath checks that every HTTP middleware admits
// every request under the allowed limit, and only the first under the
// denied one, answering the rest 429.
func TestHTTPSubjectsTakeTheirPath(t *testing.T) {
	const n = 2_000
	for _, subj := range HTTPSubjects() {
		for _, sc := range []Scenario{Allowed, Denied} {
			h, done := subj.New(sc, Admitted)
			w, r := newDiscard(), newRequest()
			admitted, refused := 0, 0
			for range n {
				if w.serve(h, r) {
					admitted++
				} else if w.code == http.StatusTooManyRequests {
					refused++
				}
			}
			done()
			want := n
			if sc == Denied {
				want = 1
			}
			if admitted != want || admitted+refused != n {
				t.Errorf("%s, scenario %d: %d of %d admitted and %d refused, want %d admitted and the rest refused",
					subj.Name, sc, admitted, n, refused, want)
			}
		}
	}
}
