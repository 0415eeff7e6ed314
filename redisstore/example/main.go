// Command payments is a payments API whose POST /payments runs at most once
// per Idempotency-Key, with the records in Redis shared by every instance.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"log"
	"net/http"
	"os"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/redisstore"
	"github.com/redis/go-redis/v9"
)

func main() {
	// One address: a single Redis. Several addresses: Redis Cluster.
	// MasterName set: Sentinel, with the sentinels as Addrs.
	client := redis.NewUniversalClient(&redis.UniversalOptions{
		Addrs:      []string{envOr("REDIS_ADDR", "127.0.0.1:6379")},
		MasterName: os.Getenv("REDIS_SENTINEL_MASTER"),
	})
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := client.Ping(ctx).Err(); err != nil {
		log.Fatalf("redis: %v", err)
	}

	store, err := redisstore.New(client, &redisstore.Config{Prefix: "payments:idem:"})
	if err != nil {
		log.Fatal(err)
	}
	mw, err := idem.NewMiddleware(store, &idem.Config{
		// Records are per tenant: one tenant's key never meets another's.
		TenantFunc: func(r *http.Request) (string, error) { return tenantOf(r), nil },
	})
	if err != nil {
		log.Fatal(err)
	}

	mux := http.NewServeMux()
	mux.Handle("POST /payments", mw.Handle(http.HandlerFunc(createPayment)))
	log.Fatal(http.ListenAndServe(envOr("ADDR", ":8080"), mux))
}

// createPayment runs once per key while the record lives, unless the
// process dies between its write and the record's completion: then a retry
// runs it again after the lease (30 s by default). The payment ID derived
// from the idempotency key makes that second run find the first payment
// instead of charging twice.
func createPayment(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Amount   int64  `json:"amount"`
		Currency string `json:"currency"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, "invalid JSON", http.StatusBadRequest)
		return
	}
	info, _ := idem.InfoFromContext(r.Context())
	sum := sha256.Sum256([]byte(info.Scope + "\x00" + info.Key))
	id := "pay_" + hex.EncodeToString(sum[:12])
	// In your database: INSERT INTO payments (id, ...) VALUES ($1, ...)
	// ON CONFLICT (id) DO NOTHING, then read the row back.

	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/payments/"+id)
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(map[string]any{"id": id, "amount": req.Amount, "currency": req.Currency})
}

// tenantOf returns the authenticated tenant. Replace it with your
// authentication; a header a client can set is not one.
func tenantOf(r *http.Request) string {
	user, _, _ := r.BasicAuth()
	return user
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
