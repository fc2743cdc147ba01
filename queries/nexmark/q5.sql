-- Nexmark q5: hot items. The auctions with the most bids in each 10-second window, sliding
-- every 2 seconds. (Nexmark outputs auction and num; the window's start is added so a run's
-- output can be checked against batch SQL window by window.)
-- weir: final: starttime + INTERVAL '10 seconds' <= :watermark
SELECT auction_bids.auction, auction_bids.num, auction_bids.w['start'] AS starttime
FROM (
    SELECT auction, count(*) AS num, window(date_time, '10 seconds', '2 seconds') AS w
    FROM STREAM bid WATERMARK date_time DELAY OF INTERVAL 4 SECONDS
    GROUP BY auction, window(date_time, '10 seconds', '2 seconds')
) auction_bids
JOIN (
    SELECT max(count_bids.num) AS maxn, count_bids.w
    FROM (
        SELECT count(*) AS num, window(date_time, '10 seconds', '2 seconds') AS w
        FROM STREAM bid WATERMARK date_time DELAY OF INTERVAL 4 SECONDS
        GROUP BY auction, window(date_time, '10 seconds', '2 seconds')
    ) count_bids
    GROUP BY count_bids.w
) max_bids
ON auction_bids.w = max_bids.w AND auction_bids.num >= max_bids.maxn;
