package client

import (
	"slices"
	"testing"
)

func TestLastOfEachKey(t *testing.T) {
	for _, tc := range []struct {
		keys []string
		want []int
	}{
		{nil, []int{}},
		{[]string{"a"}, []int{0}},
		{[]string{"b", "a", "c"}, []int{0, 1, 2}},
		{[]string{"a", "b", "a"}, []int{1, 2}},
		{[]string{"x", "x", "x"}, []int{2}},
		{[]string{"b", "a", "b", "c", "a", "b"}, []int{3, 4, 5}},
		{[]string{"a", "ab", "a\x00", "ab"}, []int{0, 2, 3}},
	} {
		keys := make([][]byte, len(tc.keys))
		for i, k := range tc.keys {
			keys[i] = []byte(k)
		}
		if got := lastOfEachKey(keys); !slices.Equal(got, tc.want) {
			t.Errorf("lastOfEachKey(%q) = %v, want %v", tc.keys, got, tc.want)
		}
	}
}
