-- Nexmark q18: last bid. Each bidder's latest bid on each auction.
-- weir: outputMode=update
-- weir: compare: bidder, auction, date_time
SELECT auction, bidder, price, channel, url, date_time, extra
FROM (
    SELECT *, row_number() OVER (PARTITION BY bidder, auction ORDER BY date_time DESC) AS rank_number
    FROM STREAM bid
) ranked
WHERE rank_number <= 1;
