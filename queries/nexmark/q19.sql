-- Nexmark q19: auction top-N. The 10 highest bids of each auction.
-- weir: outputMode=update
-- weir: compare: auction, price, rank_number
SELECT *
FROM (
    SELECT *, row_number() OVER (PARTITION BY auction ORDER BY price DESC) AS rank_number
    FROM STREAM bid
) ranked
WHERE rank_number <= 10;
