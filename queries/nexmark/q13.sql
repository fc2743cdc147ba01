-- Nexmark q13: bounded side input join. Each bid with the value its auction maps to in a static
-- table of 10,000 keys (`side_input`, registered as a batch table).
SELECT b.auction, b.bidder, b.price, b.date_time, b.extra, s.value
FROM STREAM bid AS b
JOIN side_input AS s ON b.auction % 10000 = s.key;
