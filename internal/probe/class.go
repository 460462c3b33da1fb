package probe

import "strings"

// ClassOf maps an NVML device name to the accelerator class a spec
// declares (resources.accelerator). Unknown devices give "": a node with
// an unknown class matches no spec rather than a wrong one.
func ClassOf(name string, memoryMiB uint64) string {
	n := strings.ToUpper(name)
	switch {
	case strings.Contains(n, "H200"):
		return "h200"
	case strings.Contains(n, "H100") && strings.Contains(n, "PCIE"):
		return "h100-pcie"
	case strings.Contains(n, "H100") && strings.Contains(n, "NVL"):
		return "h100-nvl"
	case strings.Contains(n, "H100"):
		// SXM5 boards report "NVIDIA H100 80GB HBM3" with no form factor.
		return "h100-sxm5"
	case strings.Contains(n, "A100"):
		// 80 GB boards report 81920 MiB; 40 GB ones 40960 MiB.
		if strings.Contains(n, "80GB") || memoryMiB > 48*1024 {
			return "a100-80gb"
		}
		return "a100-40gb"
	case strings.Contains(n, "B200"):
		return "b200"
	case strings.Contains(n, "L40S"):
		return "l40s"
	case strings.Contains(n, "RTX 4090"):
		return "rtx-4090"
	case strings.Contains(n, "L4"):
		return "l4"
	case strings.Contains(n, "A10G"):
		return "a10g"
	}
	return ""
}
