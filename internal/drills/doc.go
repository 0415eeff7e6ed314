// Package drills checks idem's stores against a model and under faults.
package drills
