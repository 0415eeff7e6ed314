-- name: CreateOrder :execlastid
INSERT INTO orders (item, quantity) VALUES (?, ?);
