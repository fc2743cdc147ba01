-- Nexmark q9: winning bids. Each auction with its highest bid placed while it was open (the
-- earliest of equal ones).
-- weir: outputMode=update
-- weir: compare: id, price, bid_date_time
SELECT id, item_name, description, initial_bid, reserve, date_time, expires, seller, category,
       extra, auction, bidder, price, bid_date_time, bid_extra
FROM (
    SELECT a.*, b.auction, b.bidder, b.price, b.date_time AS bid_date_time, b.extra AS bid_extra,
           row_number() OVER (PARTITION BY a.id ORDER BY b.price DESC, b.date_time ASC) AS rownum
    FROM STREAM auction WATERMARK date_time DELAY OF INTERVAL 4 SECONDS AS a
    JOIN STREAM bid WATERMARK date_time DELAY OF INTERVAL 4 SECONDS AS b
      ON a.id = b.auction AND b.date_time BETWEEN a.date_time AND a.expires
) ranked
WHERE rownum <= 1;
