package canonjson

import "testing"

// benchSmall is a typical small payment request body: five members, not in
// canonical order, no escapes.
const benchSmall = `{"amountCents":2599,"currency":"USD","reference":"order-1001","customer":"cus_8e03978e40d5","x":123}`

// benchLarge is a larger nested body: an order with arrays of objects,
// whitespace, escapes, non-ASCII text and numbers that need rewriting.
const benchLarge = `{
  "order": {
    "id": "ord_3f9a2c71b8e4",
    "createdAt": "2024-05-17T09:41:23.118Z",
    "status": "pending",
    "currency": "EUR",
    "totals": {"subtotalCents": 18450, "taxCents": 3505, "shippingCents": 490, "discountCents": -1000, "grandTotalCents": 21445, "taxRate": 0.190},
    "customer": {
      "id": "cus_8e03978e40d5",
      "name": "Zoë Müller-Łukasiewicz",
      "email": "zoe.mueller@example.com",
      "phone": "+49 30 1234567",
      "address": {"line1": "Straße des 17. Juni 135", "line2": null, "city": "Berlin", "postalCode": "10623", "country": "DE"},
      "tags": ["vip", "newsletter", "b2b"]
    },
    "lines": [
      {"sku": "SKU-1001", "title": "Café \"Crema\" beans, 1 kg", "quantity": 2, "unitPriceCents": 2499, "attributes": {"roast": "medium", "origin": "Ethiopia"}},
      {"sku": "SKU-2044", "title": "Teekanne \u00bbSencha\u00ab 250 g", "quantity": 1, "unitPriceCents": 1299, "attributes": {"grade": "first flush", "origin": "日本"}},
      {"sku": "SKU-3310", "title": "Grinder \\ burr set", "quantity": 1, "unitPriceCents": 8900, "attributes": {"voltage": 230, "warrantyYears": 2.0}},
      {"sku": "SKU-4002", "title": "Mug 🙂 350 ml", "quantity": 3, "unitPriceCents": 1084, "attributes": {"colour": "blue", "dishwasherSafe": true}}
    ],
    "shipping": {"method": "express", "carrier": "DHL", "notes": "Bitte beim Nachbarn abgeben.\nKlingel defekt\t(2. OG)", "window": {"from": "09:00", "to": "13:00"}},
    "payment": {"method": "card", "brand": "visa", "last4": "4242", "expMonth": 12, "expYear": 2027, "threeDS": {"version": "2.2.0", "result": "authenticated"}},
    "metadata": {"source": "web", "campaign": "spring-sale", "ref": "a/b/c", "experiment": {"bucket": 7, "variant": "B"}}
  },
  "idempotencyHint": "order-1001",
  "apiVersion": "2024-04-01"
}`

func benchmarkAppend(b *testing.B, body string) {
	src := []byte(body)
	dst, err := Append(nil, src)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(src)))
	b.ReportAllocs()
	for b.Loop() {
		dst, _ = Append(dst[:0], src)
	}
}

func BenchmarkAppend(b *testing.B) {
	b.Run("small", func(b *testing.B) { benchmarkAppend(b, benchSmall) })
	b.Run("large", func(b *testing.B) { benchmarkAppend(b, benchLarge) })
}
