-- Nexmark q20: expand bid with auction. Each bid on an auction of category 10 with the
-- auction's fields.
--
-- Nexmark's join has no time bound. The generator only ever bids on one of the newest
-- inFlightAuctions (100) auctions or up to 10 ahead: opened at most about 1,700 events before
-- the bid, or about 170 after it. The bound below says so in event time, for any
-- firstEventRate of 10,000 events/s or more, so the watermark evicts what can no longer match;
-- the differential test checks the result equals Nexmark's unbounded join over the same events
-- (the batch run leaves the bound's line out).
SELECT b.auction, b.bidder, b.price, b.channel, b.url, b.date_time, b.extra,
       a.item_name, a.description, a.initial_bid, a.reserve, a.date_time AS auction_date_time,
       a.expires, a.seller, a.category, a.extra AS auction_extra
FROM STREAM bid WATERMARK date_time DELAY OF INTERVAL 4 SECONDS AS b
JOIN STREAM auction WATERMARK date_time DELAY OF INTERVAL 4 SECONDS AS a
  ON b.auction = a.id
 AND b.date_time BETWEEN a.date_time - INTERVAL 1 SECOND AND a.date_time + INTERVAL 10 SECONDS -- weir: streaming only
WHERE a.category = 10;
