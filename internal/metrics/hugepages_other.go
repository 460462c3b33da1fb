//go:build !linux

package metrics

func adviseHuge([]Point) {}
